package kubetest

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestExpandAsTheKubelet(t *testing.T) {
	vars := map[string]string{"A": "a", "EMPTY": "", "B": "$(A)"}
	lookup := func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
	for in, want := range map[string]string{
		"":                "",
		"plain":           "plain",
		"$(A)":            "a",
		"x$(A)y$(A)":      "xaya",
		"$(B)":            "$(A)", // one pass: a value is not expanded again
		"$(EMPTY)|":       "|",
		"$(UNDEFINED)":    "$(UNDEFINED)",
		"$$(A)":           "$(A)",
		"$$$(A)":          "$a",
		"$$":              "$",
		"$A":              "$A",
		"$":               "$",
		"a$":              "a$",
		"$(A":             "$(A",
		"$()":             "$()",
		"$(A)$(UNDEF)$$x": "a$(UNDEF)$x",
	} {
		assert.Equal(t, want, expand(in, lookup), "expand(%q)", in)
	}
}

func TestPodIPIsAStableLoopbackAddressOutside127_0(t *testing.T) {
	assert.Equal(t, PodIP("ns", "worker-0"), PodIP("ns", "worker-0"), "a name keeps its address")
	assert.NotEqual(t, PodIP("ns", "worker-0"), PodIP("other", "worker-0"))
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	low := netip.MustParsePrefix("127.0.0.0/16")
	for i := range 20000 {
		ip := netip.MustParseAddr(PodIP("ns", "p-"+strconv.Itoa(i)))
		b := ip.As4()
		require.True(t, loopback.Contains(ip), ip.String())
		require.False(t, low.Contains(ip), ip.String())
		require.NotContains(t, []byte{0, 255}, b[3], ip.String())
	}
}

func TestHostsLines(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ps-0", Namespace: "train"}}
	assert.Empty(t, hostsLine(p, false), "no hostname and subdomain: no name elsewhere")
	assert.Equal(t, PodIP("train", "ps-0")+"\tps-0", hostsLine(p, true), "its own node's pods know their host names")
	p.Spec.Hostname, p.Spec.Subdomain = "ps-0", "ps"
	assert.Equal(t, PodIP("train", "ps-0")+"\tps-0.ps.train.svc.cluster.local ps-0.ps.train.svc", hostsLine(p, false))

	path := filepath.Join(t.TempDir(), "hosts")
	h, err := newHostsFile(path, "n1")
	require.NoError(t, err)
	before, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, h.set("train/ps-1/u1", "127.1.1.1\tb"))
	require.NoError(t, h.set("train/ps-0/u0", "127.1.1.2\ta"))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(b), "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.1.1.2\ta\n127.1.1.1\tb\n"), string(b))
	require.NoError(t, h.set("train/ps-0/u0", ""))
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "127.1.1.2", "a removed pod's line goes, and the file is cut to its new length")
	assert.Contains(t, string(b), "127.1.1.1\tb\n")
	after, err := os.Stat(path)
	require.NoError(t, err)
	assert.True(t, os.SameFile(before, after), "rewritten in place, so bind mounts see it")
}

func TestFindCgroups(t *testing.T) {
	const v1Mounts = `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:29 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	const v1Self = "9:name=systemd:/\n4:memory:/tests/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n"
	cg, err := findCgroups(v1Mounts, v1Self)
	require.NoError(t, err)
	assert.Equal(t, cgroups{memory: "/sys/fs/cgroup/memory/tests/abc", cpu: "/sys/fs/cgroup/cpu"}, cg)

	// Co-mounted cpu,cpuacct, and a mount whose root is the process's cgroup (a container).
	const comounted = `31 30 0:28 /docker/x /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
34 30 0:31 /docker/x /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
`
	cg, err = findCgroups(comounted, "4:memory:/docker/x/inner\n3:cpu,cpuacct:/docker/x\n")
	require.NoError(t, err)
	assert.Equal(t, cgroups{memory: "/sys/fs/cgroup/memory/inner", cpu: "/sys/fs/cgroup/cpu,cpuacct"}, cg)

	// cgroup v2 only: the unified hierarchy must offer memory and cpu.
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "user.slice", "test"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "user.slice", "test", "cgroup.controllers"), []byte("cpuset cpu io memory pids\n"), 0o644))
	v2Mounts := "35 24 0:30 / " + strings.ReplaceAll(dir, " ", `\040`) + " rw - cgroup2 cgroup2 rw,nsdelegate\n"
	cg, err = findCgroups(v2Mounts, "0::/user.slice/test\n")
	require.NoError(t, err)
	want := filepath.Join(dir, "user.slice", "test")
	assert.Equal(t, cgroups{v2: true, memory: want, cpu: want}, cg)

	require.NoError(t, os.WriteFile(filepath.Join(want, "cgroup.controllers"), []byte("pids\n"), 0o644))
	_, err = findCgroups(v2Mounts, "0::/user.slice/test\n")
	assert.ErrorContains(t, err, "not both memory and cpu")
	_, err = findCgroups("", "")
	assert.Error(t, err)
}

func TestResourceValues(t *testing.T) {
	c := &corev1.Container{Name: "main", Resources: corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("100Mi")},
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")},
	}}
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}
	for _, tc := range []struct {
		res, divisor, want string
	}{
		{"limits.memory", "", "104857600"},
		{"limits.memory", "1Mi", "100"},
		{"limits.memory", "1Gi", "1"}, // rounded up
		{"requests.cpu", "", "1"},     // 250m in whole cores, rounded up
		{"requests.cpu", "1m", "250"},
		{"limits.cpu", "", "3"}, // unset: the node's
		{"requests.memory", "", "0"},
	} {
		ref := &corev1.ResourceFieldSelector{Resource: tc.res}
		if tc.divisor != "" {
			ref.Divisor = resource.MustParse(tc.divisor)
		}
		got, err := resourceValue(c, ref, capacity)
		require.NoError(t, err, tc.res)
		assert.Equal(t, tc.want, got, "%s / %s", tc.res, tc.divisor)
	}
	_, err := resourceValue(c, &corev1.ResourceFieldSelector{Resource: "limits.hugepages-2Mi"}, capacity)
	assert.Error(t, err)
}

// objects is an objectSource of fixed Secrets and ConfigMaps.
type objects struct {
	secrets    map[string]*corev1.Secret
	configMaps map[string]*corev1.ConfigMap
}

func (o objects) secret(_ context.Context, _, name string) (*corev1.Secret, error) {
	if s, ok := o.secrets[name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func (o objects) configMap(_ context.Context, _, name string) (*corev1.ConfigMap, error) {
	if cm, ok := o.configMaps[name]; ok {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func TestContainerEnvInTheKubeletsOrder(t *testing.T) {
	src := objects{
		secrets:    map[string]*corev1.Secret{"s": {Data: map[string][]byte{"PASSWORD": []byte("pw")}}},
		configMaps: map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"MODE": "fast", "LEVEL": "3"}}},
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}, Spec: corev1.PodSpec{NodeName: "n1"}}
	yes := true
	c := &corev1.Container{
		Name: "main",
		EnvFrom: []corev1.EnvFromSource{
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}, Prefix: "CM_"},
			{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}},
			{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: &yes}},
		},
		Env: []corev1.EnvVar{
			{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "URL", Value: "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)/$(NODE)/$(LATER)"},
			{Name: "LATER", Value: "x"},
			{Name: "CM_MODE", Value: "slow"}, // env overrides envFrom
			{Name: "OPT", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "missing", Optional: &yes,
			}}},
		},
	}
	env, r := containerEnv(t.Context(), src, pod, c, serviceEnv("6443"), nil)
	require.Nil(t, r)
	assert.Equal(t, []string{
		"CM_LEVEL=3", "CM_MODE=slow", "PASSWORD=pw",
		"NODE=n1", "URL=https://127.0.0.1:6443/n1/$(LATER)", "LATER=x",
		"KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=6443", "KUBERNETES_SERVICE_PORT_HTTPS=6443", "KUBERNETES_PORT=tcp://127.0.0.1:6443",
	}, env.environ())

	c.Env = []corev1.EnvVar{{Name: "K", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "missing",
	}}}}
	_, r = containerEnv(t.Context(), src, pod, c, serviceEnv("6443"), nil)
	require.NotNil(t, r)
	assert.Equal(t, "CreateContainerConfigError", r.reason)
	assert.True(t, r.retry)
	assert.Equal(t, "couldn't find key missing in Secret ns/s", r.message)
}

func TestRestartBackoffDoublesToTenTimes(t *testing.T) {
	b := backoff{base: time.Second, limit: 10 * time.Second}
	var got []time.Duration
	for range 6 {
		got = append(got, b.next(time.Millisecond))
	}
	assert.Equal(t, []time.Duration{1, 2, 4, 8, 10, 10}, scale(got, time.Second))
	assert.Equal(t, time.Second, b.next(time.Minute), "a long run resets it")
}

func scale(ds []time.Duration, unit time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / unit
	}
	return out
}

func TestReadinessThresholds(t *testing.T) {
	tr := newReadyTracker(&corev1.Probe{SuccessThreshold: 2, FailureThreshold: 3})
	ready := false
	for i, step := range []struct{ ok, want bool }{
		{true, false}, {true, true}, // two successes make it ready
		{false, true}, {false, true}, {false, false}, // three failures make it unready
		{true, false}, {false, false}, {true, false}, {true, true},
	} {
		ready = tr.add(step.ok, ready)
		assert.Equal(t, step.want, ready, "step %d", i)
	}
}

func TestStartScript(t *testing.T) {
	s := startScript{
		cgroupProcs: []string{"/sys/fs/cgroup/memory/x/cgroup.procs"},
		hostname:    "ps-0",
		tmpfs:       []string{"/run"},
		mounts: []bindMount{
			{src: "/tmp/n/hosts", dst: "/etc/hosts", file: true},
			{src: "/tmp/n/pods/u/volumes/it's", dst: "/run/data", create: true, readOnly: true},
		},
		workDir: "/tmp/n/pods/u/home",
		mount:   "/usr/bin/mount",
		mkdir:   "/usr/bin/mkdir",
	}
	text := s.String()
	for _, want := range []string{
		"echo $$ >'/sys/fs/cgroup/memory/x/cgroup.procs' || fail",
		"echo 'ps-0' >/proc/sys/kernel/hostname",
		"/usr/bin/mount -t tmpfs -o mode=755 kubetest '/run'",
		"/usr/bin/mount --bind '/tmp/n/hosts' '/etc/hosts'",
		"/usr/bin/mkdir -p '/run/data'",
		`/usr/bin/mount --bind '/tmp/n/pods/u/volumes/it'\''s' '/run/data'`,
		"/usr/bin/mount -o remount,bind,ro '/run/data'",
		"cd '/tmp/n/pods/u/home'",
	} {
		assert.Contains(t, text, want)
	}
	assert.True(t, strings.HasSuffix(text, "exec \"$@\" 3>&-\n"), "the pod's binary replaces the shell: its pid is the one started")
	assert.Less(t, strings.Index(text, "tmpfs"), strings.Index(text, "--bind '/tmp/n/pods"), "mounts under /run come after its tmpfs")
}

func TestRunNodeReportsEveryBadOption(t *testing.T) {
	_, err := (&ControlPlane{}).RunNode(t.Context(), "n", NodeOptions{
		Images:         map[string]string{"a": filepath.Join(t.TempDir(), "missing"), "b": t.TempDir()},
		RestartBackoff: -time.Second,
	})
	require.ErrorIs(t, err, ErrInvalidConfig)
	for _, want := range []string{"RestartBackoff", `image "a"`, `image "b"`} {
		assert.ErrorContains(t, err, want)
	}
}

func TestMemorySizeAsTheKubelet(t *testing.T) {
	q := func(s string) *resource.Quantity {
		v := resource.MustParse(s)
		return &v
	}
	for _, tc := range []struct {
		sizeLimit   *resource.Quantity
		limit, node string
		want        int64
		why         string
	}{
		{q("64Mi"), "256Mi", "8Gi", 64 << 20, "the sizeLimit, lowest"},
		{q("2Gi"), "96Mi", "8Gi", 96 << 20, "the memory limit, lower than the sizeLimit"},
		{q("16Gi"), "", "8Gi", 8 << 30, "the node's capacity, lower than the sizeLimit"},
		{nil, "128Mi", "8Gi", 128 << 20, "no sizeLimit: the memory limit"},
		{nil, "", "8Gi", 8 << 30, "no limits: the node's capacity"},
		{q("1Gi"), "", "", 1 << 30, "a node of no memory capacity"},
		{q("0"), "", "", 0, "nothing set: the kernel's default"},
	} {
		c := &corev1.Container{}
		if tc.limit != "" {
			c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(tc.limit)}
		}
		capacity := corev1.ResourceList{}
		if tc.node != "" {
			capacity[corev1.ResourceMemory] = resource.MustParse(tc.node)
		}
		assert.Equal(t, tc.want, memorySize(tc.sizeLimit, c, capacity), tc.why)
	}
}

func TestHostPathSourceByType(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(file, link))

	for _, tc := range []struct {
		path    string
		typ     corev1.HostPathType
		want    volumeSource
		wantErr string
		why     string
	}{
		{path: filepath.Join(dir, "a", "b"), typ: corev1.HostPathDirectoryOrCreate, want: volumeSource{path: filepath.Join(dir, "a", "b")}, why: "made, with its parents"},
		{path: filepath.Join(dir, "none"), typ: corev1.HostPathUnset, want: volumeSource{path: filepath.Join(dir, "none")}, why: "no type: made a directory, as a runtime does"},
		{path: filepath.Join(dir, "absent"), typ: corev1.HostPathDirectory, wantErr: "is not a directory", why: "Directory makes nothing"},
		{path: file, typ: corev1.HostPathDirectory, wantErr: "is not a directory"},
		{path: file, typ: corev1.HostPathDirectoryOrCreate, wantErr: "is not a directory"},
		{path: dir, typ: corev1.HostPathFile, wantErr: "is not a file"},
		{path: link, typ: corev1.HostPathFile, want: volumeSource{path: file, file: true}, why: "a link resolved"},
		{path: filepath.Join(dir, "new"), typ: corev1.HostPathFileOrCreate, want: volumeSource{path: filepath.Join(dir, "new"), file: true}},
		{path: "relative", typ: corev1.HostPathUnset, wantErr: "not absolute"},
	} {
		got, err := hostPathSource(tc.path, tc.typ)
		if tc.wantErr != "" {
			assert.ErrorContains(t, err, tc.wantErr, "%s %q: %s", tc.typ, tc.path, tc.why)
			continue
		}
		require.NoError(t, err, "%s %q", tc.typ, tc.path)
		real, err := filepath.EvalSymlinks(tc.want.path)
		require.NoError(t, err)
		tc.want.path = real
		assert.Equal(t, tc.want, got, "%s %q: %s", tc.typ, tc.path, tc.why)
	}
	assert.NoDirExists(t, filepath.Join(dir, "absent"))
}

func TestCoversSystem(t *testing.T) {
	for p, want := range map[string]bool{
		"/": true, "/etc": true, "/dev": true, "/dev/pts": true, "/proc/1": true, "/sys": true,
		"/dev/shm": false, "/dev/shm/x": false, "/mnt": false, "/etc/app": false, "/devices": false,
	} {
		assert.Equal(t, want, coversSystem(p), p)
	}
}
