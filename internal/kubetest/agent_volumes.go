package kubetest

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// rootCAConfigMap is the ConfigMap that the controller manager publishes in every namespace with
// the apiserver's CA, and that the projected volume of a ServiceAccount token names.
const rootCAConfigMap = "kube-root-ca.crt"

// defaultTokenExpiration is the lifetime of a projected token whose source gives none.
const defaultTokenExpiration = 3600 // seconds

// bindMount is one mount that a pod's start script makes in the pod's mount namespace.
type bindMount struct {
	src, dst string
	file     bool // src and dst are files, not directories
	create   bool // dst lies in the pod's own /run and is made first
	readOnly bool
}

// volumeDir returns the directory that holds volume name of a pod whose directory is podDir.
func volumeDir(podDir, name string) string { return filepath.Join(podDir, "volumes", name) }

// checkVolumes refuses, for good, a volume the agent does not emulate.
func checkVolumes(pod *corev1.Pod) *refusal {
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.EmptyDir != nil, v.Secret != nil, v.ConfigMap != nil, v.DownwardAPI != nil:
		case v.Projected != nil:
			for _, s := range v.Projected.Sources {
				if s.ServiceAccountToken == nil && s.Secret == nil && s.ConfigMap == nil && s.DownwardAPI == nil {
					return unsupported("volume %q: the kubetest agent projects only serviceAccountToken, secret, configMap and downwardAPI sources", v.Name)
				}
			}
		default:
			return unsupported("volume %q: the kubetest agent emulates emptyDir, secret, configMap, downwardAPI and projected volumes only", v.Name)
		}
	}
	return nil
}

// planMounts returns the bind mounts of container c's volumeMounts, or refuses the pod for good
// when one cannot be made: see mountTarget.
func (n *Node) planMounts(pod *corev1.Pod, c *corev1.Container, podDir, binary string) ([]bindMount, *refusal) {
	var mounts []bindMount
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			return nil, unsupported("volumeMount %q: the kubetest agent does not mount subPaths", m.Name)
		}
		if !hasVolume(pod, m.Name) {
			return nil, unsupported("volumeMount %q: no such volume", m.Name)
		}
		dst, inRun, err := n.mountTarget(m.MountPath, binary)
		if err != nil {
			return nil, unsupported("volumeMount %q: %v", m.Name, err)
		}
		mounts = append(mounts, bindMount{src: volumeDir(podDir, m.Name), dst: dst, create: inRun, readOnly: m.ReadOnly})
	}
	return mounts, nil
}

func hasVolume(pod *corev1.Pod, name string) bool {
	for _, v := range pod.Spec.Volumes {
		if v.Name == name {
			return true
		}
	}
	return false
}

// mountTarget returns where, in a pod's mount namespace, a mount at path is made, and whether
// that lies under the tmpfs the pod gets over /run (and so /var/run): there the agent makes any
// directory it needs. Elsewhere path must be an existing directory, which the mount covers for
// that pod only, and may not hold the pod's binary nor the node's files, nor be /, /etc, /proc,
// /sys or /dev or lie under the last three.
func (n *Node) mountTarget(path, binary string) (target string, inRun bool, err error) {
	if !filepath.IsAbs(path) {
		return "", false, fmt.Errorf("mount path %q is not absolute", path)
	}
	p := filepath.Clean(path)
	for _, alias := range []string{"/run", "/var/run"} {
		if rel, ok := under(p, alias); ok {
			real, ok := n.runDirs[alias]
			if !ok {
				return "", false, fmt.Errorf("mount path %q: this machine has no %s", path, alias)
			}
			return filepath.Join(real, rel), true, nil
		}
	}
	switch p {
	case "/", "/etc", "/proc", "/sys", "/dev":
		return "", false, fmt.Errorf("mount path %q would cover the system", path)
	}
	for _, sys := range []string{"/proc", "/sys", "/dev"} {
		if _, ok := under(p, sys); ok {
			return "", false, fmt.Errorf("mount path %q would cover the system", path)
		}
	}
	for _, keep := range []string{binary, n.dir} {
		if _, ok := under(keep, p); ok {
			return "", false, fmt.Errorf("mount path %q would hide %s", path, keep)
		}
	}
	fi, err := os.Stat(p)
	if err != nil || !fi.IsDir() {
		return "", false, fmt.Errorf("mount path %q: outside /run and /var/run the kubetest agent mounts only over an existing directory", path)
	}
	return p, false, nil
}

// under reports whether path p is dir or lies under it, and returns its path relative to dir.
func under(p, dir string) (string, bool) {
	if p == dir {
		return "", true
	}
	if dir == "/" {
		return p, true
	}
	rel, ok := strings.CutPrefix(p, dir+"/")
	return rel, ok
}

// prepareVolumes makes the directory of each of pod's volumes and writes the files of its
// secret, configMap, downwardAPI and projected volumes, once before the first start: unlike a
// kubelet's, they do not follow later changes of their sources, and a token is not renewed.
// A source that is missing and not optional refuses the container, waiting as
// ContainerCreating, until a later try finds it.
func (n *Node) prepareVolumes(ctx context.Context, pod *corev1.Pod, podDir string) *refusal {
	for _, v := range pod.Spec.Volumes {
		dir := volumeDir(podDir, v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return &refusal{final: true, reason: "VolumeError", message: err.Error()}
		}
		var err error
		switch {
		case v.Secret != nil:
			err = n.secretFiles(ctx, pod, dir, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional, mode(v.Secret.DefaultMode))
		case v.ConfigMap != nil:
			err = n.configMapFiles(ctx, pod, dir, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional, mode(v.ConfigMap.DefaultMode))
		case v.DownwardAPI != nil:
			err = downwardFiles(pod, dir, v.DownwardAPI.Items, mode(v.DownwardAPI.DefaultMode), n.opts.Capacity)
		case v.Projected != nil:
			err = n.projectedFiles(ctx, pod, dir, v.Projected)
		}
		if err != nil {
			return &refusal{retry: true, reason: "ContainerCreating", message: fmt.Sprintf("MountVolume.SetUp failed for volume %q: %v", v.Name, err)}
		}
	}
	return nil
}

// mode returns a volume's file mode: m, or 0644, the API's default.
func mode(m *int32) fs.FileMode {
	if m == nil {
		return 0o644
	}
	return fs.FileMode(*m) & fs.ModePerm
}

func itemMode(m *int32, def fs.FileMode) fs.FileMode {
	if m == nil {
		return def
	}
	return fs.FileMode(*m) & fs.ModePerm
}

// writeVolumeFile writes data at relative path name under dir with mode perm.
func writeVolumeFile(dir, name string, data []byte, perm fs.FileMode) error {
	if !filepath.IsLocal(name) {
		return fmt.Errorf("file path %q is not local to the volume", name)
	}
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(p, data, perm); err != nil {
		return err
	}
	return os.Chmod(p, perm) // WriteFile keeps the mode of a file that exists
}

// keyFiles writes the keys of data (all of them, or items) as files under dir.
func keyFiles(dir string, data map[string][]byte, items []corev1.KeyToPath, opt bool, perm fs.FileMode, what string) error {
	if len(items) == 0 {
		for k, v := range data {
			if err := writeVolumeFile(dir, k, v, perm); err != nil {
				return err
			}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if opt {
				continue
			}
			return fmt.Errorf("couldn't find key %s in %s", it.Key, what)
		}
		if err := writeVolumeFile(dir, it.Path, v, itemMode(it.Mode, perm)); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) secretFiles(ctx context.Context, pod *corev1.Pod, dir, name string, items []corev1.KeyToPath, opt *bool, perm fs.FileMode) error {
	s, err := apiObjects{n.cp}.secret(ctx, pod.Namespace, name)
	if err != nil {
		if apierrors.IsNotFound(err) && optional(opt) {
			return nil
		}
		return err
	}
	return keyFiles(dir, s.Data, items, optional(opt), perm, "Secret "+pod.Namespace+"/"+name)
}

func (n *Node) configMapFiles(ctx context.Context, pod *corev1.Pod, dir, name string, items []corev1.KeyToPath, opt *bool, perm fs.FileMode) error {
	cm, err := apiObjects{n.cp}.configMap(ctx, pod.Namespace, name)
	if apierrors.IsNotFound(err) && name == rootCAConfigMap {
		// The controller manager would have published it; there is none, so the agent
		// serves what it would hold.
		cm, err = &corev1.ConfigMap{Data: map[string]string{"ca.crt": string(n.cp.caPEM)}}, nil
	}
	if err != nil {
		if apierrors.IsNotFound(err) && optional(opt) {
			return nil
		}
		return err
	}
	data := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		data[k] = v
	}
	return keyFiles(dir, data, items, optional(opt), perm, "ConfigMap "+pod.Namespace+"/"+name)
}

func downwardFiles(pod *corev1.Pod, dir string, items []corev1.DownwardAPIVolumeFile, perm fs.FileMode, capacity corev1.ResourceList) error {
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = fieldValue(pod, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			v, err = resourceValue(&pod.Spec.Containers[0], it.ResourceFieldRef, capacity)
		}
		if err != nil {
			return err
		}
		if err := writeVolumeFile(dir, it.Path, []byte(v), itemMode(it.Mode, perm)); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) projectedFiles(ctx context.Context, pod *corev1.Pod, dir string, p *corev1.ProjectedVolumeSource) error {
	perm := mode(p.DefaultMode)
	for _, s := range p.Sources {
		var err error
		switch {
		case s.ServiceAccountToken != nil:
			err = n.tokenFile(ctx, pod, dir, s.ServiceAccountToken, perm)
		case s.Secret != nil:
			err = n.secretFiles(ctx, pod, dir, s.Secret.Name, s.Secret.Items, s.Secret.Optional, perm)
		case s.ConfigMap != nil:
			err = n.configMapFiles(ctx, pod, dir, s.ConfigMap.Name, s.ConfigMap.Items, s.ConfigMap.Optional, perm)
		case s.DownwardAPI != nil:
			err = downwardFiles(pod, dir, s.DownwardAPI.Items, perm, n.opts.Capacity)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// tokenFile issues a token of the pod's ServiceAccount through the TokenRequest API, bound to
// the pod as a kubelet's is (it stops working once the pod is gone), and writes it.
func (n *Node) tokenFile(ctx context.Context, pod *corev1.Pod, dir string, src *corev1.ServiceAccountTokenProjection, perm fs.FileMode) error {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	exp := int64(defaultTokenExpiration)
	if src.ExpirationSeconds != nil {
		exp = *src.ExpirationSeconds
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: &exp,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		req.Spec.Audiences = []string{src.Audience}
	}
	tr, err := n.cp.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for ServiceAccount %s/%s: %w", pod.Namespace, sa, err)
	}
	return writeVolumeFile(dir, src.Path, []byte(tr.Status.Token), perm)
}
