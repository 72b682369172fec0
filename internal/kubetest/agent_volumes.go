package kubetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
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

// volumeSource is where a volume's files are on the machine, as prepareVolumes found them.
type volumeSource struct {
	path     string
	file     bool // a file, not a directory (a hostPath may be either)
	readOnly bool // every mount of it is read-only: a claim's readOnly
}

// volumeDir returns the directory that holds volume name of a pod whose directory is podDir.
func volumeDir(podDir, name string) string { return filepath.Join(podDir, "volumes", name) }

// checkVolumes refuses, for good, a volume the agent does not emulate.
func checkVolumes(pod *corev1.Pod) *refusal {
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.Secret != nil, v.ConfigMap != nil, v.DownwardAPI != nil, v.PersistentVolumeClaim != nil:
		case v.EmptyDir != nil:
			if m := v.EmptyDir.Medium; m != corev1.StorageMediumDefault && m != corev1.StorageMediumMemory {
				return unsupported("volume %q: emptyDir medium %q: the kubetest agent emulates the default medium and Memory only", v.Name, m)
			}
		case v.HostPath != nil:
			if t := hostPathType(v.HostPath.Type); !hostPathTypeSupported(t) {
				return unsupported("volume %q: hostPath type %q: the kubetest agent mounts only directories and files (types \"\", Directory, DirectoryOrCreate, File, FileOrCreate)", v.Name, t)
			}
		case v.Projected != nil:
			for _, s := range v.Projected.Sources {
				if s.ServiceAccountToken == nil && s.Secret == nil && s.ConfigMap == nil && s.DownwardAPI == nil {
					return unsupported("volume %q: the kubetest agent projects only serviceAccountToken, secret, configMap and downwardAPI sources", v.Name)
				}
			}
		default:
			return unsupported("volume %q: the kubetest agent emulates emptyDir, hostPath, persistentVolumeClaim, secret, configMap, downwardAPI and projected volumes only", v.Name)
		}
	}
	return nil
}

func hostPathType(t *corev1.HostPathType) corev1.HostPathType {
	if t == nil {
		return corev1.HostPathUnset
	}
	return *t
}

func hostPathTypeSupported(t corev1.HostPathType) bool {
	switch t {
	case corev1.HostPathUnset, corev1.HostPathDirectory, corev1.HostPathDirectoryOrCreate, corev1.HostPathFile, corev1.HostPathFileOrCreate:
		return true
	}
	return false
}

// checkMounts refuses, for good, a pod whose container's volumeMounts the agent cannot make
// whatever their volumes turn out to be: a subPath, an unknown volume, a mount path that
// mountTarget refuses.
func (n *Node) checkMounts(pod *corev1.Pod, c *corev1.Container, binary string) *refusal {
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			return unsupported("volumeMount %q: the kubetest agent does not mount subPaths", m.Name)
		}
		if !hasVolume(pod, m.Name) {
			return unsupported("volumeMount %q: no such volume", m.Name)
		}
		if _, _, err := n.mountTarget(m.MountPath, binary); err != nil {
			return unsupported("volumeMount %q: %v", m.Name, err)
		}
	}
	return nil
}

// planMounts returns the mounts of a start of container c: first etc (the node's files), then
// its volumeMounts, each from its volume's source. It refuses the pod for good when a mount
// cannot be made: outside the pod's /run its target must exist, a directory for a directory
// and a file for a file; and no source may lie where the pod's /run or another of its mounts
// covers it, for the mounts are made in the pod's mount namespace, one after the other.
func (n *Node) planMounts(c *corev1.Container, sources map[string]volumeSource, binary string, etc []bindMount) ([]bindMount, *refusal) {
	mounts := slices.Clone(etc)
	for _, m := range c.VolumeMounts {
		src, ok := sources[m.Name]
		if !ok {
			return nil, unsupported("volumeMount %q: no such volume", m.Name)
		}
		dst, inRun, err := n.mountTarget(m.MountPath, binary)
		if err != nil {
			return nil, unsupported("volumeMount %q: %v", m.Name, err)
		}
		if !inRun {
			fi, err := os.Stat(dst)
			switch {
			case err != nil:
				return nil, unsupported("volumeMount %q: mount path %q: outside /run and /var/run the kubetest agent mounts only over an existing directory or file: %v", m.Name, m.MountPath, err)
			case fi.IsDir() && src.file:
				return nil, unsupported("volumeMount %q: mount path %q is a directory, and the volume is the file %s", m.Name, m.MountPath, src.path)
			case !fi.IsDir() && !src.file:
				return nil, unsupported("volumeMount %q: mount path %q is not a directory: outside /run and /var/run the kubetest agent mounts a directory only over an existing directory", m.Name, m.MountPath)
			}
		}
		mounts = append(mounts, bindMount{src: src.path, dst: dst, file: src.file, create: inRun, readOnly: m.ReadOnly || src.readOnly})
	}
	for i, m := range mounts {
		for _, run := range n.runDirs {
			if _, ok := under(m.src, run); ok {
				return nil, unsupported("a volume's source %s lies under %s, which the pod's own tmpfs covers", m.src, run)
			}
		}
		for j, o := range mounts {
			if _, ok := under(m.src, o.dst); ok && i != j {
				return nil, unsupported("a volume's source %s lies under %s, which another of the pod's mounts covers", m.src, o.dst)
			}
		}
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

// mountTarget returns where, in a pod's mount namespace, a mount at path is made (symbolic
// links resolved), and whether that lies under the tmpfs the pod gets over /run (and so
// /var/run): there the agent makes any directory or file it needs. Elsewhere the mount covers
// what is there for that pod only, and may not hide the pod's binary nor the node's files, nor
// cover the system: see coversSystem.
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
	real := p
	if r, err := filepath.EvalSymlinks(p); err == nil {
		real = r
	}
	for _, run := range n.runDirs {
		if _, ok := under(real, run); ok {
			return real, true, nil
		}
	}
	if coversSystem(p) || coversSystem(real) {
		return "", false, fmt.Errorf("mount path %q would cover the system", path)
	}
	for _, keep := range []string{binary, n.dir} {
		if _, ok := under(keep, real); ok {
			return "", false, fmt.Errorf("mount path %q would hide %s", path, keep)
		}
	}
	return real, false, nil
}

// coversSystem reports whether a mount at p would cover the system's files: /, /etc, /proc,
// /sys, /dev and what lies under the last three, but for /dev/shm, which a pod has of its own
// on a kubelet too.
func coversSystem(p string) bool {
	if _, ok := under(p, "/dev/shm"); ok {
		return false
	}
	if p == "/" || p == "/etc" {
		return true
	}
	for _, sys := range []string{"/proc", "/sys", "/dev"} {
		if _, ok := under(p, sys); ok {
			return true
		}
	}
	return false
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

// prepareVolumes finds or makes the source of each of the pod's volumes, once before the first
// start, and records them in w.sources:
//   - emptyDir, secret, configMap, downwardAPI and projected: a directory of the pod's, where
//     the files of the last four are written; unlike a kubelet's, they do not follow later
//     changes of their sources, and a token is not renewed. An emptyDir of medium Memory is a
//     tmpfs mounted on that directory (see memorySize), so that it lasts across the container's
//     restarts, until the pod ends.
//   - hostPath: its path, checked by its type (see hostPathSource).
//   - persistentVolumeClaim: the path of the hostPath or local PersistentVolume the claim is
//     bound to (see claimSource).
//
// A source that is missing and not optional, a claim not bound, a failed check of a hostPath's
// type refuse the container, waiting as ContainerCreating, until a later try succeeds; a
// PersistentVolume of another kind refuses the pod for good.
func (w *podWorker) prepareVolumes(ctx context.Context, pod *corev1.Pod) *refusal {
	sources := make(map[string]volumeSource, len(pod.Spec.Volumes))
	for _, v := range pod.Spec.Volumes {
		var src volumeSource
		var r *refusal
		switch {
		case v.HostPath != nil:
			var err error
			if src, err = hostPathSource(v.HostPath.Path, hostPathType(v.HostPath.Type)); err != nil {
				r = mountFailed(v.Name, err)
			}
		case v.PersistentVolumeClaim != nil:
			src, r = w.n.claimSource(ctx, pod, v.Name, v.PersistentVolumeClaim)
		default:
			src, r = w.podVolume(ctx, pod, v)
		}
		if r != nil {
			return r
		}
		sources[v.Name] = src
	}
	w.sources = sources
	return nil
}

// mountFailed refuses a container, for the time being, for volume name's err.
func mountFailed(name string, err error) *refusal {
	return &refusal{retry: true, reason: "ContainerCreating", message: fmt.Sprintf("MountVolume.SetUp failed for volume %q: %v", name, err)}
}

// podVolume makes the directory of volume v, one of the pod's own, and writes its files.
func (w *podWorker) podVolume(ctx context.Context, pod *corev1.Pod, v corev1.Volume) (volumeSource, *refusal) {
	n := w.n
	dir := volumeDir(w.dir, v.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return volumeSource{}, &refusal{final: true, reason: "VolumeError", message: err.Error()}
	}
	var err error
	switch {
	case v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory:
		if !slices.Contains(w.tmpfs, dir) {
			if err = mountTmpfs(dir, memorySize(v.EmptyDir.SizeLimit, &pod.Spec.Containers[0], n.opts.Capacity)); err == nil {
				w.tmpfs = append(w.tmpfs, dir)
			}
		}
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
		return volumeSource{}, mountFailed(v.Name, err)
	}
	return volumeSource{path: dir}, nil
}

// memorySize returns the size in bytes of the tmpfs of an emptyDir of medium Memory, as a
// kubelet sizes it: the node's memory capacity, or the container's memory limit if lower, or
// the volume's sizeLimit if lower still; 0 (the kernel's default, half the machine's memory)
// if none is set.
func memorySize(sizeLimit *resource.Quantity, c *corev1.Container, capacity corev1.ResourceList) int64 {
	var size int64
	lower := func(q resource.Quantity, ok bool) {
		if v := q.Value(); ok && v > 0 && (size == 0 || v < size) {
			size = v
		}
	}
	q, ok := capacity[corev1.ResourceMemory]
	lower(q, ok)
	q, ok = c.Resources.Limits[corev1.ResourceMemory]
	lower(q, ok)
	if sizeLimit != nil {
		lower(*sizeLimit, true)
	}
	return size
}

// unmountVolumes unmounts the tmpfs of the pod's Memory emptyDirs.
func (w *podWorker) unmountVolumes() {
	for _, dir := range w.tmpfs {
		if err := unmount(dir); err != nil {
			w.n.log.Error("pod volume", "pod", w.key(), "err", err)
		}
	}
	w.tmpfs = nil
}

// hostPathSource checks path as a kubelet checks a hostPath volume of type t, and makes it
// where t says: DirectoryOrCreate makes a missing directory (mode 0755, with its parents),
// FileOrCreate a missing file (mode 0644, not its parents). With no type, as a container
// runtime does, a missing path is made a directory. It returns the source with symbolic links
// resolved.
func hostPathSource(path string, t corev1.HostPathType) (volumeSource, error) {
	if !filepath.IsAbs(path) {
		return volumeSource{}, fmt.Errorf("hostPath %q is not absolute", path)
	}
	fi, err := os.Stat(path)
	missing := errors.Is(err, fs.ErrNotExist)
	if err != nil && !missing {
		return volumeSource{}, err
	}
	switch {
	case missing && (t == corev1.HostPathUnset || t == corev1.HostPathDirectoryOrCreate):
		if err := os.MkdirAll(path, 0o755); err != nil {
			return volumeSource{}, err
		}
	case missing && t == corev1.HostPathFileOrCreate:
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return volumeSource{}, err
		}
		f.Close()
	case t == corev1.HostPathDirectory || t == corev1.HostPathDirectoryOrCreate:
		if missing || !fi.IsDir() {
			return volumeSource{}, fmt.Errorf("hostPath type check failed: %s is not a directory", path)
		}
	case t == corev1.HostPathFile || t == corev1.HostPathFileOrCreate:
		if missing || !fi.Mode().IsRegular() {
			return volumeSource{}, fmt.Errorf("hostPath type check failed: %s is not a file", path)
		}
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return volumeSource{}, err
	}
	if fi, err = os.Stat(real); err != nil {
		return volumeSource{}, err
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return volumeSource{}, fmt.Errorf("hostPath %s is neither a directory nor a file", path)
	}
	return volumeSource{path: real, file: !fi.IsDir()}, nil
}

// claimSource returns the source of volume name, claim src of pod: the path of the
// PersistentVolume that the claim is bound to, which must be of type hostPath (checked as
// hostPathSource checks a hostPath volume) or local (an existing directory). The container
// waits while the claim is missing, being deleted or not bound, as on a kubelet; a volume of
// another type, or of volumeMode Block, fails the pod.
func (n *Node) claimSource(ctx context.Context, pod *corev1.Pod, name string, src *corev1.PersistentVolumeClaimVolumeSource) (volumeSource, *refusal) {
	claims := n.cp.Client.CoreV1().PersistentVolumeClaims(pod.Namespace)
	claim, err := claims.Get(ctx, src.ClaimName, metav1.GetOptions{})
	if err != nil {
		return volumeSource{}, mountFailed(name, err)
	}
	key := pod.Namespace + "/" + src.ClaimName
	switch {
	case claim.DeletionTimestamp != nil:
		return volumeSource{}, mountFailed(name, fmt.Errorf("PersistentVolumeClaim %s is being deleted", key))
	case claim.Status.Phase != corev1.ClaimBound || claim.Spec.VolumeName == "":
		return volumeSource{}, mountFailed(name, fmt.Errorf("PersistentVolumeClaim %s is not bound (phase %s): waiting for the binder (the controller manager's persistentvolume-binder-controller) to bind it to a PersistentVolume", key, claim.Status.Phase))
	}
	pv, err := n.cp.Client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return volumeSource{}, mountFailed(name, err)
	}
	if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != claim.UID {
		return volumeSource{}, mountFailed(name, fmt.Errorf("PersistentVolume %s is not bound to claim %s", pv.Name, key))
	}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return volumeSource{}, unsupported("volume %q: PersistentVolume %s of claim %s is a block device: the kubetest agent mounts only filesystem volumes", name, pv.Name, key)
	}
	var vs volumeSource
	switch {
	case pv.Spec.HostPath != nil:
		vs, err = hostPathSource(pv.Spec.HostPath.Path, hostPathType(pv.Spec.HostPath.Type))
	case pv.Spec.Local != nil:
		var fi os.FileInfo
		if fi, err = os.Stat(pv.Spec.Local.Path); err == nil && !fi.IsDir() {
			err = fmt.Errorf("local path %s is not a directory", pv.Spec.Local.Path)
		}
		if err == nil {
			vs.path, err = filepath.EvalSymlinks(pv.Spec.Local.Path)
		}
	default:
		return volumeSource{}, unsupported("volume %q: PersistentVolume %s of claim %s is of type %s: the kubetest agent mounts only hostPath and local PersistentVolumes", name, pv.Name, key, pvType(&pv.Spec.PersistentVolumeSource))
	}
	if err != nil {
		return volumeSource{}, mountFailed(name, fmt.Errorf("PersistentVolume %s: %w", pv.Name, err))
	}
	vs.readOnly = src.ReadOnly
	return vs, nil
}

// pvType names the type of a PersistentVolume's source by its field's name ("nfs", "csi"...).
func pvType(src *corev1.PersistentVolumeSource) string {
	b, err := json.Marshal(src)
	var fields map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(b, &fields)
	}
	if err != nil || len(fields) == 0 {
		return "none"
	}
	return strings.Join(slices.Sorted(maps.Keys(fields)), ", ")
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
