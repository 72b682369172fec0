//go:build linux

package kubetest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/elasticps/elasticps/internal/kubetest"
)

// withVolume gives the pod volume v, mounted at path.
func withVolume(p *corev1.Pod, v corev1.VolumeSource, name, path string) *corev1.Pod {
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: v})
	c := &p.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: path})
	return p
}

func claimVolume(claim string, readOnly bool) corev1.VolumeSource {
	return corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: readOnly}}
}

func hostPathVolume(path string, t corev1.HostPathType) corev1.VolumeSource {
	return corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &t}}
}

// createClaim creates claim ns/name of 1Gi, ReadWriteMany, of class (nil: none given).
func createClaim(t *testing.T, e agentRun, name string, class *string) {
	t.Helper()
	_, err := e.cp.Client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse("1Gi"),
			}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// waitingAs returns a condition that holds once the pod's container waits for reason.
func waitingAs(reason string) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == reason
	}
}

// A claim of a hostPath PersistentVolume, ReadWriteMany, is one directory for the pods of every
// node, as an NFS share of a job's checkpoints would be.
func TestAgentMountsAClaimOnEveryNode(t *testing.T) {
	e := agentSetup(t, "agent-claim", 2)
	cp, ctx, ns := e.cp, e.ctx, e.ns
	dir := t.TempDir()
	pv, err := cp.CreateHostPathVolume(ctx, kubetest.HostPathVolume{
		Name:        ns + "-checkpoints",
		Path:        dir,
		Capacity:    resource.MustParse("10Gi"),
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
		Claim:       types.NamespacedName{Namespace: ns, Name: "checkpoints"},
	})
	require.NoError(t, err)
	createClaim(t, e, "checkpoints", nil) // as the job's manifests: no class, and none is the default

	createPod(t, ctx, cp, withVolume(helperPod(ns, "writer", e.names[0], "write", "/mnt/shared.txt", "from node 0"),
		claimVolume("checkpoints", false), "ckpt", "/mnt"))
	got, err := cp.WaitPod(ctx, ns, "writer", terminal)
	require.NoError(t, err)
	require.Equal(t, corev1.PodSucceeded, got.Status.Phase, e.nodes[0].Logs(ns, "writer"))
	b, err := os.ReadFile(filepath.Join(dir, "shared.txt"))
	require.NoError(t, err, "the file is in the volume's directory")
	assert.Equal(t, "from node 0", string(b))

	createPod(t, ctx, cp, withVolume(helperPod(ns, "reader", e.names[1], "read", "/mnt/shared.txt"),
		claimVolume("checkpoints", false), "ckpt", "/mnt"))
	got, err = cp.WaitPod(ctx, ns, "reader", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodSucceeded, got.Status.Phase)
	assert.Contains(t, e.nodes[1].Logs(ns, "reader"), "read /mnt/shared.txt: from node 0\n", "a pod of another node reads it")

	// A claim mounted readOnly is read-only in the pod.
	createPod(t, ctx, cp, withVolume(helperPod(ns, "read-only", e.names[1], "write", "/mnt/refused.txt", "no"),
		claimVolume("checkpoints", true), "ckpt", "/mnt"))
	got, err = cp.WaitPod(ctx, ns, "read-only", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodFailed, got.Status.Phase)
	assert.Contains(t, e.nodes[1].Logs(ns, "read-only"), "read-only file system")
	assert.NoFileExists(t, filepath.Join(dir, "refused.txt"))

	claim, err := cp.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "checkpoints", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.ClaimBound, claim.Status.Phase)
	assert.Equal(t, pv.Name, claim.Spec.VolumeName)
}

// A pod whose claim is not bound waits, whatever brought it to its node, and runs once the
// claim binds. A claim of a volume the agent cannot mount fails the pod.
func TestAgentWaitsForAClaimToBind(t *testing.T) {
	e := agentSetup(t, "agent-unbound", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	class := "kubetest-late"
	createClaim(t, e, "late", &class)

	// The scheduler leaves a pod of an unbound claim unscheduled; this one names its node.
	p := withVolume(helperPod(ns, "patient", node, "write", "/mnt/done", "bound"), claimVolume("late", false), "ckpt", "/mnt")
	p.Spec.NodeName = node
	createPod(t, ctx, cp, p)
	got, err := cp.WaitPod(ctx, ns, "patient", waitingAs("ContainerCreating"))
	require.NoError(t, err)
	assert.Equal(t, corev1.PodPending, got.Status.Phase)
	assert.Contains(t, containerStatus(t, got).State.Waiting.Message, "PersistentVolumeClaim "+ns+"/late is not bound")

	dir := t.TempDir()
	_, err = cp.CreateHostPathVolume(ctx, kubetest.HostPathVolume{
		Name:             ns + "-late",
		Path:             dir,
		StorageClassName: class,
		Claim:            types.NamespacedName{Namespace: ns, Name: "late"},
	})
	require.NoError(t, err)
	got, err = cp.WaitPod(ctx, ns, "patient", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodSucceeded, got.Status.Phase)
	b, err := os.ReadFile(filepath.Join(dir, "done"))
	require.NoError(t, err)
	assert.Equal(t, "bound", string(b))

	_, err = cp.Client.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-nfs"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				NFS: &corev1.NFSVolumeSource{Server: "127.0.0.1", Path: "/exports"}, // never reached
			},
			ClaimRef: &corev1.ObjectReference{Namespace: ns, Name: "shared"},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	createClaim(t, e, "shared", nil)
	createPod(t, ctx, cp, withVolume(helperPod(ns, "nfs", node, "sleep"), claimVolume("shared", false), "ckpt", "/mnt"))
	got, err = cp.WaitPod(ctx, ns, "nfs", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodFailed, got.Status.Phase)
	assert.Equal(t, kubetest.ReasonUnsupported, got.Status.Reason)
	assert.Contains(t, got.Status.Message, "of type nfs")
}

// mountedUnder reports whether this process's mount namespace has a mount whose mount point
// contains s.
func mountedUnder(t *testing.T, s string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.Contains(f[4], s) {
			return true
		}
	}
	return false
}

// A Memory emptyDir at /dev/shm is the pod's own tmpfs, of its sizeLimit, and lasts across the
// container's restarts.
func TestAgentGivesAPodItsOwnShm(t *testing.T) {
	e := agentSetup(t, "agent-shm", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	n := e.nodes[0]
	shm := func(sizeLimit string) corev1.VolumeSource {
		q := resource.MustParse(sizeLimit)
		return corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &q}}
	}
	file := fmt.Sprintf("/dev/shm/kubetest-%s-%d", ns, os.Getpid())
	createPod(t, ctx, cp, withVolume(withLimits(helperPod(ns, "sized", node, "write", file, "x"), "", "256Mi"),
		shm("64Mi"), "shm", "/dev/shm"))
	createPod(t, ctx, cp, withVolume(withLimits(helperPod(ns, "capped", node, "write", file, "x"), "", "96Mi"),
		shm("2Gi"), "shm", "/dev/shm"))
	restarting := withTCPReadiness(withPodIP(helperPod(ns, "restarting", node, "fail-once", "/dev/shm", "$(POD_IP):8080")), 8080)
	restarting.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	createPod(t, ctx, cp, withVolume(restarting, shm("16Mi"), "shm", "/dev/shm"))

	for name, size := range map[string]int{"sized": 64 << 20, "capped": 96 << 20} {
		got, err := cp.WaitPod(ctx, ns, name, terminal)
		require.NoError(t, err)
		assert.Equal(t, corev1.PodSucceeded, got.Status.Phase, name)
		assert.Contains(t, n.Logs(ns, name), fmt.Sprintf("filesystem size=%d type=%#x\n", size, tmpfsMagic),
			"%s: a tmpfs of its sizeLimit, or of its memory limit if lower", name)
		assert.False(t, mountedUnder(t, string(got.UID)), "%s: its tmpfs is gone once it has ended", name)
	}
	assert.NoFileExists(t, file, "the machine's /dev/shm is not the pod's")

	got, err := cp.WaitPod(ctx, ns, "restarting", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount == 1 && isReady(p)
	})
	require.NoError(t, err)
	assert.True(t, mountedUnder(t, string(got.UID)), "the tmpfs is mounted while the pod lives")
	assert.Contains(t, n.Logs(ns, "restarting"), "found the marker\n", "the second run found the first's marker in /dev/shm")
	deleteAndWait(t, ctx, cp, ns, "restarting", nil)
}

// hostPath volumes are checked and made by their type.
func TestAgentMountsHostPaths(t *testing.T) {
	e := agentSetup(t, "agent-hostpath", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	n := e.nodes[0]
	base := t.TempDir()
	made := filepath.Join(base, "made", "here")
	createPod(t, ctx, cp, withVolume(helperPod(ns, "made", node, "write", "/mnt/hello", "hi"),
		hostPathVolume(made, corev1.HostPathDirectoryOrCreate), "data", "/mnt"))
	conf := filepath.Join(base, "conf")
	require.NoError(t, os.WriteFile(conf, []byte("from the machine"), 0o644))
	createPod(t, ctx, cp, withVolume(helperPod(ns, "file", node, "read", "/run/kubetest/conf"),
		hostPathVolume(conf, corev1.HostPathFile), "conf", "/run/kubetest/conf"))
	createPod(t, ctx, cp, withVolume(helperPod(ns, "missing", node, "sleep"),
		hostPathVolume(filepath.Join(base, "absent"), corev1.HostPathDirectory), "data", "/mnt"))

	got, err := cp.WaitPod(ctx, ns, "made", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodSucceeded, got.Status.Phase, n.Logs(ns, "made"))
	b, err := os.ReadFile(filepath.Join(made, "hello"))
	require.NoError(t, err, "DirectoryOrCreate made the directory, and the pod wrote in it")
	assert.Equal(t, "hi", string(b))

	got, err = cp.WaitPod(ctx, ns, "file", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodSucceeded, got.Status.Phase)
	assert.Contains(t, n.Logs(ns, "file"), "read /run/kubetest/conf: from the machine\n")

	got, err = cp.WaitPod(ctx, ns, "missing", waitingAs("ContainerCreating"))
	require.NoError(t, err)
	assert.Contains(t, containerStatus(t, got).State.Waiting.Message, "hostPath type check failed")
	assert.NoDirExists(t, filepath.Join(base, "absent"), "type Directory makes nothing")
	deleteAndWait(t, ctx, cp, ns, "missing", nil)
}
