//go:build linux

package kubetest_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/elasticps/elasticps/internal/kubetest"
)

// helperImage is the image the agent tests' pods run: this test binary, in a helper mode.
const helperImage = "kubetest/helper"

// agentRun is what agentSetup gives a test.
type agentRun struct {
	cp    *kubetest.ControlPlane
	ctx   context.Context // bounded by testTimeout
	ns    string          // a fresh namespace
	nodes []*kubetest.Node
	names []string // of the nodes
}

// runs numbers the agent tests' runs, so that each run (-count) has its own namespace and
// nodes: with no controller manager a namespace is never deleted, and a node's pods outlive it.
var runs atomic.Int64

// agentSetup returns the shared control plane, a context bounded by testTimeout, a fresh
// namespace named after base, and as many node agents, which run helperImage. Each pod of the
// test names its node in its nodeSelector, so that tests running in parallel keep to their own
// nodes.
func agentSetup(t *testing.T, base string, nodes int) agentRun {
	t.Helper()
	cp := cluster.Get(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	exe, err := os.Executable()
	require.NoError(t, err)
	r := agentRun{cp: cp, ctx: ctx, ns: base + "-" + strconv.FormatInt(runs.Add(1), 10)}
	require.NoError(t, cp.CreateNamespace(ctx, r.ns))
	for i := range nodes {
		name := r.ns + "-" + strconv.Itoa(i)
		r.names = append(r.names, name)
		r.nodes = append(r.nodes, cp.StartNode(t, name, kubetest.NodeOptions{
			Capacity:       resources("4", "8Gi"),
			Images:         map[string]string{helperImage: exe},
			RestartBackoff: 200 * time.Millisecond,
			Logger:         slog.New(slog.NewTextHandler(t.Output(), nil)),
		}))
	}
	return r
}

// helperPod returns a pod of helperImage on node, restartPolicy Never, that runs the helper
// with args (see runHelper).
func helperPod(ns, name, node string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector:  map[string]string{corev1.LabelHostname: node},
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name:    "main",
				Image:   helperImage,
				Command: []string{"helper", "kubetest-helper"}, // [0] names the image's entrypoint
				Args:    args,
			}},
		},
	}
}

// withPodIP gives the pod's container its address as $(POD_IP).
func withPodIP(p *corev1.Pod) *corev1.Pod {
	c := &p.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"},
	}})
	return p
}

// withTCPReadiness makes the pod ready once it accepts connections on port.
func withTCPReadiness(p *corev1.Pod, port int) *corev1.Pod {
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(port)}},
		PeriodSeconds: 1,
	}
	return p
}

func withLimits(p *corev1.Pod, cpu, memory string) *corev1.Pod {
	l := corev1.ResourceList{}
	if cpu != "" {
		l[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	if memory != "" {
		l[corev1.ResourceMemory] = resource.MustParse(memory)
	}
	p.Spec.Containers[0].Resources.Limits = l
	return p
}

func createPod(t *testing.T, ctx context.Context, cp *kubetest.ControlPlane, p *corev1.Pod) {
	t.Helper()
	_, err := cp.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	require.NoError(t, err)
}

func inPhase(phases ...corev1.PodPhase) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		for _, ph := range phases {
			if p.Status.Phase == ph {
				return true
			}
		}
		return false
	}
}

var terminal = inPhase(corev1.PodSucceeded, corev1.PodFailed)

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// containerStatus returns the pod's one container status, failing t if it has none.
func containerStatus(t *testing.T, p *corev1.Pod) corev1.ContainerStatus {
	t.Helper()
	require.Len(t, p.Status.ContainerStatuses, 1, "status %+v", p.Status)
	return p.Status.ContainerStatuses[0]
}

// deleteAndWait deletes pod ns/name with grace (nil: the pod's own) and waits until it is gone
// from the API. It returns the pod's last state, as the deletion event carries it, and how long
// the deletion took.
func deleteAndWait(t *testing.T, ctx context.Context, cp *kubetest.ControlPlane, ns, name string, grace *int64) (*corev1.Pod, time.Duration) {
	t.Helper()
	pods := cp.Client.CoreV1().Pods(ns)
	sel := fields.OneTermEqualSelector(metav1.ObjectNameField, name).String()
	list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: sel})
	require.NoError(t, err)
	require.Len(t, list.Items, 1, "pod %s/%s exists", ns, name)
	last := &list.Items[0]
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	require.NoError(t, err)
	defer w.Stop()
	start := time.Now()
	require.NoError(t, pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: grace}))
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); ok {
			last = p
		}
		if ev.Type == watch.Deleted {
			return last, time.Since(start)
		}
	}
	t.Fatalf("pod %s/%s not gone (last phase %s): %v", ns, name, last.Status.Phase, ctx.Err())
	return nil, 0
}

func TestAgentRunsAPodAsAProcess(t *testing.T) {
	e := agentSetup(t, "agent-run", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	n := e.nodes[0]
	_, err := cp.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		Data:       map[string][]byte{"token": []byte("s3cret")},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	p := helperPod(ns, "runner", node, "serve", "$(POD_IP):8080", "$(GREETING)", "$$(GREETING)", "$(NOT_DEFINED)")
	p.Labels = map[string]string{"app": "demo"}
	withTCPReadiness(withLimits(withPodIP(p), "", "128Mi"), 8080)
	c := &p.Spec.Containers[0]
	c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}
	c.Env = append(c.Env,
		corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		corev1.EnvVar{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
		corev1.EnvVar{Name: "GREETING", Value: "hello-$(POD_NAME)"},
		corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "token",
		}}},
		corev1.EnvVar{Name: "MEM_MIB", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
			Resource: "limits.memory", Divisor: resource.MustParse("1Mi"),
		}}},
		corev1.EnvVar{Name: "CPU_MILLI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
			Resource: "requests.cpu", Divisor: resource.MustParse("1m"),
		}}},
	)
	createPod(t, ctx, cp, p)

	got, err := cp.WaitPod(ctx, ns, "runner", isReady)
	require.NoError(t, err)
	ip := kubetest.PodIP(ns, "runner")
	assert.Equal(t, ip, got.Status.PodIP)
	assert.True(t, strings.HasPrefix(ip, "127.") && !strings.HasPrefix(ip, "127.0."), "a pod's address is in 127/8 outside 127.0/16: %s", ip)
	assert.Equal(t, "127.0.0.1", got.Status.HostIP)
	assert.Equal(t, corev1.PodRunning, got.Status.Phase)
	cs := containerStatus(t, got)
	pid := n.Pid(ns, "runner")
	require.NotZero(t, pid)
	assert.Equal(t, "kubetest://"+strconv.Itoa(pid), cs.ContainerID)
	assert.True(t, cs.Ready)
	require.NotNil(t, cs.State.Running)
	memCgroup, cpuCgroup := n.CgroupDir(ns, "runner", "memory"), n.CgroupDir(ns, "runner", "cpu")
	require.DirExists(t, memCgroup)
	require.DirExists(t, cpuCgroup)

	// It serves on its own address, and says its host name is its pod's.
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "8080"), 10*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	r := bufio.NewReader(conn)
	fmt.Fprintln(conn, "hello")
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "hello runner\n", line)
	fmt.Fprintln(conn, "quit")
	line, err = r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "bye\n", line)

	got, err = cp.WaitPod(ctx, ns, "runner", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodSucceeded, got.Status.Phase)
	term := containerStatus(t, got).State.Terminated
	require.NotNil(t, term)
	assert.Equal(t, "Completed", term.Reason)
	assert.Equal(t, int32(0), term.ExitCode)
	assert.NoDirExists(t, memCgroup, "the pod's cgroups go with its last process")
	assert.NoDirExists(t, cpuCgroup)
	assert.Zero(t, n.Pid(ns, "runner"))

	logs := n.Logs(ns, "runner")
	u, err := url.Parse(cp.URL)
	require.NoError(t, err)
	for _, want := range []string{
		"arg[0]=" + ip + ":8080",
		"arg[1]=hello-runner",   // $(GREETING), itself made of $(POD_NAME)
		"arg[2]=$(GREETING)",    // $$ escapes
		"arg[3]=$(NOT_DEFINED)", // left as written
		"hostname=runner",
		"env APP=demo",
		"env TOKEN=s3cret",
		"env MEM_MIB=128",
		"env CPU_MILLI=250",
		"env HOSTNAME=runner",
		"env KUBERNETES_SERVICE_HOST=127.0.0.1",
		"env KUBERNETES_SERVICE_PORT=" + u.Port(),
	} {
		assert.Contains(t, logs, want+"\n")
	}
	var names []string
	for _, l := range strings.Split(logs, "\n") {
		if kv, ok := strings.CutPrefix(l, "env "); ok {
			name, _, _ := strings.Cut(kv, "=")
			names = append(names, name)
		}
	}
	assert.ElementsMatch(t, []string{
		"APP", "CPU_MILLI", "GREETING", "HOME", "HOSTNAME", "MEM_MIB", "PATH", "POD_IP", "POD_NAME", "TOKEN",
		"KUBERNETES_PORT", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "KUBERNETES_SERVICE_PORT_HTTPS",
	}, names, "the environment is the pod's, not the test's")
}

func TestAgentReportsOOMKilled(t *testing.T) {
	e := agentSetup(t, "agent-oom", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	createPod(t, ctx, cp, withLimits(helperPod(ns, "hog", node, "touch", "256"), "", "64Mi"))
	createPod(t, ctx, cp, withLimits(helperPod(ns, "fits", node, "touch", "16"), "", "64Mi"))

	got, err := cp.WaitPod(ctx, ns, "hog", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodFailed, got.Status.Phase)
	term := containerStatus(t, got).State.Terminated
	require.NotNil(t, term)
	assert.Equal(t, "OOMKilled", term.Reason)
	assert.Equal(t, int32(137), term.ExitCode)

	got, err = cp.WaitPod(ctx, ns, "fits", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodSucceeded, got.Status.Phase, "16 MiB fit under 64 MiB")
	term = containerStatus(t, got).State.Terminated
	require.NotNil(t, term)
	assert.Equal(t, "Completed", term.Reason)
}

// readCgroupInts reads the integers of a cgroup file ("max" reads as -1).
func readCgroupInts(t *testing.T, path string) []int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []int64
	for _, f := range strings.Fields(string(b)) {
		if f == "max" {
			out = append(out, -1)
			continue
		}
		v, err := strconv.ParseInt(f, 10, 64)
		require.NoError(t, err)
		out = append(out, v)
	}
	return out
}

func TestAgentSetsCgroupLimits(t *testing.T) {
	e := agentSetup(t, "agent-cpu", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	n := e.nodes[0]
	createPod(t, ctx, cp, withLimits(helperPod(ns, "half", node, "sleep"), "500m", "96Mi"))
	_, err := cp.WaitPod(ctx, ns, "half", inPhase(corev1.PodRunning))
	require.NoError(t, err)

	cpu, mem := n.CgroupDir(ns, "half", "cpu"), n.CgroupDir(ns, "half", "memory")
	require.NotEmpty(t, cpu)
	if _, err := os.Stat(filepath.Join(cpu, "cpu.max")); err == nil { // cgroup v2
		v := readCgroupInts(t, filepath.Join(cpu, "cpu.max"))
		require.Len(t, v, 2)
		assert.Equal(t, v[1], 2*v[0], "quota is half the period")
		assert.Equal(t, []int64{96 << 20}, readCgroupInts(t, filepath.Join(mem, "memory.max")))
	} else {
		quota := readCgroupInts(t, filepath.Join(cpu, "cpu.cfs_quota_us"))
		period := readCgroupInts(t, filepath.Join(cpu, "cpu.cfs_period_us"))
		assert.Equal(t, period[0], 2*quota[0], "quota is half the period")
		assert.Equal(t, []int64{96 << 20}, readCgroupInts(t, filepath.Join(mem, "memory.limit_in_bytes")))
	}
	pid := n.Pid(ns, "half")
	require.NotZero(t, pid)
	procs, err := os.ReadFile(filepath.Join(cpu, "cgroup.procs"))
	require.NoError(t, err)
	assert.Contains(t, strings.Fields(string(procs)), strconv.Itoa(pid), "the pod's process is in its cgroup")

	deleteAndWait(t, ctx, cp, ns, "half", nil)
}

func TestAgentDeletesWithGrace(t *testing.T) {
	e := agentSetup(t, "agent-grace", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	n := e.nodes[0]
	createPod(t, ctx, cp, withTCPReadiness(withPodIP(helperPod(ns, "graceful", node, "serve", "$(POD_IP):8080")), 8080))
	createPod(t, ctx, cp, withTCPReadiness(withPodIP(helperPod(ns, "stubborn", node, "serve-ignoring", "$(POD_IP):8080")), 8080))
	for _, name := range []string{"graceful", "stubborn"} {
		_, err := cp.WaitPod(ctx, ns, name, isReady) // ready: it has set up its signals
		require.NoError(t, err)
	}

	last, took := deleteAndWait(t, ctx, cp, ns, "graceful", ptr(int64(30)))
	assert.Less(t, took, 20*time.Second, "a process that ends at SIGTERM ends the deletion")
	assert.Contains(t, n.Logs(ns, "graceful"), "term\n")
	assert.Equal(t, corev1.PodSucceeded, last.Status.Phase, "the final status is written before the pod goes")
	if term := containerStatus(t, last).State.Terminated; assert.NotNil(t, term) {
		assert.Equal(t, int32(0), term.ExitCode)
	}

	pid := n.Pid(ns, "stubborn")
	require.NotZero(t, pid)
	last, took = deleteAndWait(t, ctx, cp, ns, "stubborn", ptr(int64(1)))
	assert.GreaterOrEqual(t, took, time.Second, "SIGKILL waits for the grace period")
	assert.NotContains(t, n.Logs(ns, "stubborn"), "term\n")
	assert.Equal(t, corev1.PodFailed, last.Status.Phase)
	if term := containerStatus(t, last).State.Terminated; assert.NotNil(t, term) {
		assert.Equal(t, int32(137), term.ExitCode)
		assert.Equal(t, int32(syscall.SIGKILL), term.Signal)
		assert.Equal(t, "Error", term.Reason)
	}
	assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "the process is gone")
}

func ptr[T any](v T) *T { return &v }

func TestAgentServesNamesOfPods(t *testing.T) {
	e := agentSetup(t, "agent-dns", 2)
	cp, ctx, ns := e.cp, e.ctx, e.ns
	_, err := cp.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "svc"},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  map[string]string{"app": "a"},
			Ports:     []corev1.ServicePort{{Port: 8080}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	a := withTCPReadiness(withPodIP(helperPod(ns, "a-0", e.names[0], "serve", "$(POD_IP):8080")), 8080)
	a.Labels = map[string]string{"app": "a"}
	a.Spec.Hostname, a.Spec.Subdomain = "a", "svc"
	createPod(t, ctx, cp, a)
	_, err = cp.WaitPod(ctx, ns, "a-0", isReady)
	require.NoError(t, err)

	// On another node, whose agent learnt the name from its own watch.
	name := "a.svc." + ns + ".svc.cluster.local"
	createPod(t, ctx, cp, helperPod(ns, "b", e.names[1], "dial", name, "8080"))
	got, err := cp.WaitPod(ctx, ns, "b", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodSucceeded, got.Status.Phase)
	bLogs := e.nodes[1].Logs(ns, "b")
	assert.Contains(t, bLogs, "resolved "+name+" to ["+kubetest.PodIP(ns, "a-0")+"]")
	assert.Contains(t, bLogs, "answer: hello a\n", "a pod's host name is its spec.hostname")

	deleteAndWait(t, ctx, cp, ns, "a-0", nil)
}

func TestAgentGivesPodsInClusterCredentials(t *testing.T) {
	e := agentSetup(t, "agent-incluster", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	n := e.nodes[0]
	for _, sa := range []string{"reader", "nobody"} {
		_, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: sa},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	bindPodReader(t, ctx, cp, ns, "reader", "list")

	// The authorizer may lag the binding by a moment: the reader retries as a pod of
	// restartPolicy OnFailure would.
	reader := helperPod(ns, "reader", node, "list-pods")
	reader.Spec.ServiceAccountName = "reader"
	reader.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	createPod(t, ctx, cp, reader)
	nobody := helperPod(ns, "nobody", node, "list-pods")
	nobody.Spec.ServiceAccountName = "nobody"
	createPod(t, ctx, cp, nobody)
	untokened := helperPod(ns, "untokened", node, "list-pods")
	untokened.Spec.ServiceAccountName = "reader"
	untokened.Spec.AutomountServiceAccountToken = ptr(false)
	createPod(t, ctx, cp, untokened)

	got, err := cp.WaitPod(ctx, ns, "reader", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodSucceeded, got.Status.Phase, "its Role lets it list pods")
	assert.Contains(t, n.Logs(ns, "reader"), "listed ")

	got, err = cp.WaitPod(ctx, ns, "nobody", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodFailed, got.Status.Phase)
	if term := containerStatus(t, got).State.Terminated; assert.NotNil(t, term) {
		assert.Equal(t, int32(exitForbidden), term.ExitCode, "no Role: Forbidden, which says it authenticated")
	}
	assert.Contains(t, n.Logs(ns, "nobody"), "forbidden:")

	got, err = cp.WaitPod(ctx, ns, "untokened", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodFailed, got.Status.Phase, "automountServiceAccountToken false: no token")
	assert.Contains(t, n.Logs(ns, "untokened"), "in-cluster config:")
}

func TestAgentRestartsACrashedContainer(t *testing.T) {
	e := agentSetup(t, "agent-restart", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	n := e.nodes[0]
	p := withTCPReadiness(withPodIP(helperPod(ns, "flaky", node, "fail-once", "/run/scratch", "$(POD_IP):8080")), 8080)
	p.Spec.RestartPolicy = corev1.RestartPolicyAlways
	p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/run/scratch"}}
	createPod(t, ctx, cp, p)

	got, err := cp.WaitPod(ctx, ns, "flaky", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount == 1 && isReady(p)
	})
	require.NoError(t, err)
	cs := containerStatus(t, got)
	assert.Equal(t, corev1.PodRunning, got.Status.Phase)
	assert.NotNil(t, cs.State.Running)
	if last := cs.LastTerminationState.Terminated; assert.NotNil(t, last) {
		assert.Equal(t, int32(1), last.ExitCode)
		assert.Equal(t, "Error", last.Reason)
	}
	logs := n.Logs(ns, "flaky")
	assert.Contains(t, logs, "failing once\n", "the first run")
	assert.Contains(t, logs, "found the marker\n", "the second run found the first's marker in the emptyDir")

	last, _ := deleteAndWait(t, ctx, cp, ns, "flaky", nil)
	assert.Equal(t, corev1.PodSucceeded, last.Status.Phase, "it ended at SIGTERM with 0")
}

func TestAgentLeavesAnUnknownImagePending(t *testing.T) {
	e := agentSetup(t, "agent-image", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	p := helperPod(ns, "unknown", node)
	p.Spec.Containers[0].Image = "example.invalid/none"
	createPod(t, ctx, cp, p)

	got, err := cp.WaitPod(ctx, ns, "unknown", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil
	})
	require.NoError(t, err)
	assert.Equal(t, corev1.PodPending, got.Status.Phase)
	assert.Equal(t, "ErrImageNeverPull", containerStatus(t, got).State.Waiting.Reason)

	_, took := deleteAndWait(t, ctx, cp, ns, "unknown", nil)
	assert.Less(t, took, 20*time.Second, "a pod that never ran goes at once, not after its 30 s grace")
}

func TestAgentStopKillsItsPods(t *testing.T) {
	e := agentSetup(t, "agent-stop", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	n := e.nodes[0]
	var pids []int
	var dirs []string
	for _, name := range []string{"one", "two"} {
		createPod(t, ctx, cp, withLimits(helperPod(ns, name, node, "sleep"), "1", "64Mi"))
		_, err := cp.WaitPod(ctx, ns, name, inPhase(corev1.PodRunning))
		require.NoError(t, err)
		pids = append(pids, n.Pid(ns, name))
		dirs = append(dirs, n.CgroupDir(ns, name, "memory"), n.CgroupDir(ns, name, "cpu"))
	}
	for _, d := range dirs {
		require.DirExists(t, d)
	}

	n.Stop()
	n.Stop() // idempotent
	for _, pid := range pids {
		require.NotZero(t, pid)
		assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "pid %d is gone", pid)
	}
	for _, d := range dirs {
		assert.NoDirExists(t, d)
	}
	assert.Zero(t, n.Pid(ns, "one"))
	// With no agent, nothing removes the pods: a test does.
	zero := int64(0)
	for _, name := range []string{"one", "two"} {
		require.NoError(t, cp.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	}
}

func TestAgentWaitsForAMissingSecret(t *testing.T) {
	e := agentSetup(t, "agent-secret", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]
	p := helperPod(ns, "patient", node, "env")
	p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "LATE", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "late"}, Key: "k",
	}}}}
	createPod(t, ctx, cp, p)

	got, err := cp.WaitPod(ctx, ns, "patient", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil
	})
	require.NoError(t, err)
	assert.Equal(t, corev1.PodPending, got.Status.Phase)
	w := containerStatus(t, got).State.Waiting
	assert.Equal(t, "CreateContainerConfigError", w.Reason)
	assert.Contains(t, w.Message, `secret "late" not found`)

	_, err = cp.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "late"},
		Data:       map[string][]byte{"k": []byte("v")},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	got, err = cp.WaitPod(ctx, ns, "patient", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodSucceeded, got.Status.Phase)
	assert.Contains(t, e.nodes[0].Logs(ns, "patient"), "env LATE=v\n")
}

func TestAgentFailsPodsItCannotRun(t *testing.T) {
	e := agentSetup(t, "agent-refuse", 1)
	cp, ctx, ns, node := e.cp, e.ctx, e.ns, e.names[0]

	two := helperPod(ns, "two-containers", node, "sleep")
	two.Spec.Containers = append(two.Spec.Containers, two.Spec.Containers[0])
	two.Spec.Containers[1].Name = "second"
	createPod(t, ctx, cp, two)
	socket := corev1.HostPathSocket
	hostPath := helperPod(ns, "host-path", node, "sleep")
	hostPath.Spec.Volumes = []corev1.Volume{{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run/x.sock", Type: &socket}}}}
	createPod(t, ctx, cp, hostPath)
	devPts := helperPod(ns, "dev-pts", node, "sleep")
	devPts.Spec.Volumes = []corev1.Volume{{Name: "e", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	devPts.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "e", MountPath: "/dev/pts"}}
	createPod(t, ctx, cp, devPts)
	dirType := corev1.HostPathDirectory
	inRun := helperPod(ns, "source-in-run", node, "sleep")
	inRun.Spec.Volumes = []corev1.Volume{{Name: "r", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/run", Type: &dirType}}}}
	inRun.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "r", MountPath: "/mnt"}}
	createPod(t, ctx, cp, inRun) // the pod's own tmpfs covers its source

	// A start that fails before the binary runs ends as StartError; Always restarts it.
	for _, policy := range []corev1.RestartPolicy{corev1.RestartPolicyNever, corev1.RestartPolicyAlways} {
		p := helperPod(ns, "no-workdir-"+strings.ToLower(string(policy)), node, "exit", "0")
		p.Spec.RestartPolicy = policy
		p.Spec.Containers[0].WorkingDir = "/nonexistent/kubetest"
		createPod(t, ctx, cp, p)
	}

	// Two names that PodIP maps to one address: the later pod fails.
	first, second := collidingNames(ns)
	createPod(t, ctx, cp, helperPod(ns, first, node, "sleep"))
	_, err := cp.WaitPod(ctx, ns, first, inPhase(corev1.PodRunning))
	require.NoError(t, err)
	createPod(t, ctx, cp, helperPod(ns, second, node, "sleep"))

	for name, reason := range map[string]string{
		"two-containers": kubetest.ReasonUnsupported,
		"host-path":      kubetest.ReasonUnsupported,
		"dev-pts":        kubetest.ReasonUnsupported,
		"source-in-run":  kubetest.ReasonUnsupported,
		second:           kubetest.ReasonPodIPCollision,
	} {
		got, err := cp.WaitPod(ctx, ns, name, terminal)
		require.NoError(t, err)
		assert.Equal(t, corev1.PodFailed, got.Status.Phase, name)
		assert.Equal(t, reason, got.Status.Reason, name)
		assert.NotEmpty(t, got.Status.Message, name)
	}
	got, err := cp.WaitPod(ctx, ns, "no-workdir-never", terminal)
	require.NoError(t, err)
	assert.Equal(t, corev1.PodFailed, got.Status.Phase)
	if term := containerStatus(t, got).State.Terminated; assert.NotNil(t, term) {
		assert.Equal(t, "StartError", term.Reason)
		assert.Equal(t, int32(128), term.ExitCode)
		assert.Contains(t, term.Message, "working directory")
	}
	got, err = cp.WaitPod(ctx, ns, "no-workdir-always", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1 &&
			p.Status.ContainerStatuses[0].State.Waiting != nil
	})
	require.NoError(t, err)
	cs := containerStatus(t, got)
	assert.Equal(t, "CrashLoopBackOff", cs.State.Waiting.Reason)
	if last := cs.LastTerminationState.Terminated; assert.NotNil(t, last) {
		assert.Equal(t, "StartError", last.Reason)
	}
	deleteAndWait(t, ctx, cp, ns, "no-workdir-always", nil)

	got, err = cp.WaitPod(ctx, ns, first, inPhase(corev1.PodRunning))
	require.NoError(t, err)
	assert.Equal(t, kubetest.PodIP(ns, second), got.Status.PodIP, "the first keeps the address")
	deleteAndWait(t, ctx, cp, ns, first, nil)
}

// collidingNames returns two pod names of namespace ns that PodIP maps to one address.
func collidingNames(ns string) (string, string) {
	seen := make(map[string]string)
	for i := 0; ; i++ {
		name := "c-" + strconv.Itoa(i)
		ip := kubetest.PodIP(ns, name)
		if other, ok := seen[ip]; ok {
			return other, name
		}
		seen[ip] = name
	}
}
