package kubetest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// HostPathVolume describes a PersistentVolume that is a directory of this machine, which
// CreateHostPathVolume creates and a node agent mounts for the pods of the claim bound to it.
// All the node agents of a test run on one machine, so the directory is shared as an NFS
// share would be: the checkpoint directory of a job's pods, whatever node they run on.
type HostPathVolume struct {
	// Name is the PersistentVolume's name; required. PersistentVolumes belong to no
	// namespace: tests that share a control plane give theirs distinct names.
	Name string

	// Path is the directory, an absolute path; required. The volume is of hostPath type
	// DirectoryOrCreate: the agent that first mounts it makes it if it is missing.
	Path string

	// Capacity is the volume's size as the API sees it; nothing enforces it. A claim binds
	// only a volume at least as large as its request. Zero means 1Ti, which fits any claim.
	Capacity resource.Quantity

	// AccessModes are the volume's access modes, which must include every mode of a claim
	// for it to bind. Empty means ReadWriteOnce, ReadOnlyMany and ReadWriteMany, which fit any
	// claim but a ReadWriteOncePod one. The agent does not enforce them: any pod of the claim
	// mounts the directory, read-write unless its mount or its claim says readOnly.
	AccessModes []corev1.PersistentVolumeAccessMode

	// StorageClassName is the volume's class; a claim binds only a volume of its own class.
	// "" (no class) is what a claim of storageClassName "" asks for, and one with none while
	// the cluster has no default StorageClass. Where one StorageClass is annotated as the
	// default, a claim with none is given it, when created (the DefaultStorageClass admission
	// plugin) or later (the binder), and then binds only a volume of that class.
	StorageClassName string

	// Claim, if set, reserves the volume for the claim of that namespace and name (the
	// volume's spec.claimRef): the binder binds it to that claim only, and that claim to it
	// if the claim matches it and is not bound already. Tests that share a
	// control plane set it, so that a claim does not bind another test's volume (the binder
	// takes any volume that matches). Zero: any claim that matches may bind it.
	Claim types.NamespacedName
}

// validate reports every problem of v, wrapped in ErrInvalidConfig.
func (v HostPathVolume) validate() error {
	var errs []error
	if v.Name == "" {
		errs = append(errs, errors.New("Name is empty"))
	}
	if !filepath.IsAbs(v.Path) {
		errs = append(errs, fmt.Errorf("Path %q is not absolute", v.Path))
	}
	if v.Capacity.Sign() < 0 {
		errs = append(errs, fmt.Errorf("Capacity %s is negative", v.Capacity.String()))
	}
	if (v.Claim.Namespace == "") != (v.Claim.Name == "") {
		errs = append(errs, fmt.Errorf("Claim %q needs both a namespace and a name", v.Claim.String()))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// CreateHostPathVolume creates the PersistentVolume that v describes, and returns it. An error
// wraps ErrInvalidConfig for a bad v.
//
// A claim binds it only if the controller manager runs the binder: Options.Controllers must
// name "persistentvolume-binder-controller" (its alias "persistentvolume-binder" works too).
// The binder binds a claim to a volume of its storage class, of its volumeMode (Filesystem),
// whose access modes include the claim's and whose capacity is at least the claim's request:
// at once when the claim is created after the volume, else at its next periodic sync
// (--pvclaimbinder-sync-period, 15 s unless Options.ControllerFlags say otherwise). Until
// then the scheduler leaves a pod of the claim unscheduled ("unbound immediate
// PersistentVolumeClaims"). Deleting a claim or a volume that is in use
// leaves it Terminating unless the persistentvolumeclaim-protection-controller and
// persistentvolume-protection-controller run, since admission gives both a protection
// finalizer.
func (cp *ControlPlane) CreateHostPathVolume(ctx context.Context, v HostPathVolume) (*corev1.PersistentVolume, error) {
	if err := v.validate(); err != nil {
		return nil, err
	}
	capacity := v.Capacity
	if capacity.IsZero() {
		capacity = *resource.NewQuantity(1<<40, resource.BinarySI)
	}
	modes := v.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadOnlyMany, corev1.ReadWriteMany}
	}
	create := corev1.HostPathDirectoryOrCreate
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: v.Name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:         corev1.ResourceList{corev1.ResourceStorage: capacity},
			AccessModes:      modes,
			StorageClassName: v.StorageClassName,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: v.Path, Type: &create},
			},
		},
	}
	if v.Claim.Name != "" {
		pv.Spec.ClaimRef = &corev1.ObjectReference{
			APIVersion: "v1", Kind: "PersistentVolumeClaim",
			Namespace: v.Claim.Namespace, Name: v.Claim.Name,
		}
	}
	created, err := cp.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubetest: create PersistentVolume %s: %w", v.Name, err)
	}
	return created, nil
}
