package kube_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/elastic/kube"
)

// The scaler meets the Scaler contract: its pods run under the kubelet stand-in, and a crash is
// the stand-in failing a pod.
func TestScalerContract(t *testing.T) {
	elastictest.TestScaler(t, func(t *testing.T, servers int) elastictest.ScalerUnderTest {
		e := newEnv(t, nil)
		cfg := e.config("contract")
		cfg.MaxRestarts = 2
		s, rec := e.scaler(cfg)
		return elastictest.ScalerUnderTest{
			Scaler: s,
			Await: func(ctx context.Context, cond func(elastictest.Procs) bool) (elastictest.Procs, error) {
				return elastictest.AwaitChanges(ctx, rec.changes, procs(s), cond)
			},
			Crash: func(ctx context.Context, id string) error {
				return e.kubelet.end(ctx, e.ns, kube.PodName("contract", id), crash)
			},
		}
	})
}

// The pods and the Service as the scaler makes them: names, labels, DNS, the secret from a
// Secret, sizes from the plan, and the template's fields kept.
func TestPodAndServiceLayout(t *testing.T) {
	e := newEnv(t, nil)
	ctx, client := e.ctx, e.cp.Client
	prio := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "elasticps-" + e.ns}, Value: 1000}
	_, err := client.SchedulingV1().PriorityClasses().Create(ctx, prio, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = client.CoreV1().ServiceAccounts(e.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "trainer"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	owner, err := client.CoreV1().ConfigMaps(e.ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coordinator"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	ref := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}

	cfg := e.config("layout")
	cfg.Owner = &ref
	tpl := &cfg.Template
	tpl.Labels = map[string]string{"team": "ads"}
	tpl.Annotations = map[string]string{"note": "kept"}
	tpl.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "training", Effect: corev1.TaintEffectNoSchedule}}
	tpl.Spec.PriorityClassName = prio.Name
	tpl.Spec.ServiceAccountName = "trainer"
	c := &tpl.Spec.Containers[0]
	c.Env = []corev1.EnvVar{{Name: "FOO", Value: "bar"}}
	c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("1Gi")}
	s, _ := e.scaler(cfg)
	plan := elastic.Plan{Servers: 1, Workers: 1, Server: elastic.Resources{CPUs: 1.5, Memory: 2 << 30}}
	require.NoError(t, s.Scale(ctx, plan))
	assert.Equal(t, plan, s.Plan())

	addr := kube.ServerAddr("layout", e.ns, "cluster.local", 0, 7070)
	assert.Equal(t, "layout-ps-0.layout."+e.ns+".svc.cluster.local:7070", addr)
	for _, id := range []string{"ps-0", "worker-0"} {
		p := e.pod("layout", id)
		role := strings.TrimSuffix(id, "-0")
		assert.Equal(t, "layout-"+id, p.Name)
		assert.Equal(t, map[string]string{"team": "ads", "elasticps.io/job": "layout", "elasticps.io/role": role, "elasticps.io/node": id,
			"app.kubernetes.io/name": "elasticps", "app.kubernetes.io/instance": "layout", "app.kubernetes.io/component": role,
			"app.kubernetes.io/managed-by": "elasticps"}, p.Labels)
		assert.Equal(t, map[string]string{"note": "kept", "elasticps.io/restart": "0"}, p.Annotations)
		assert.Equal(t, []metav1.OwnerReference{ref}, p.OwnerReferences)
		assert.Equal(t, p.Name, p.Spec.Hostname)
		assert.Equal(t, "layout", p.Spec.Subdomain)
		assert.Equal(t, corev1.RestartPolicyNever, p.Spec.RestartPolicy)
		assert.Equal(t, int64(5), *p.Spec.TerminationGracePeriodSeconds)
		assert.Equal(t, map[string]string{corev1.LabelHostname: e.node}, p.Spec.NodeSelector)
		assert.Contains(t, p.Spec.Tolerations, tpl.Spec.Tolerations[0])
		assert.Equal(t, prio.Name, p.Spec.PriorityClassName)
		assert.Equal(t, int32(1000), *p.Spec.Priority)
		assert.Equal(t, "trainer", p.Spec.ServiceAccountName)
		require.Len(t, p.Spec.Containers, 1)
		ct := p.Spec.Containers[0]
		assert.Equal(t, []string{"/elasticps"}, ct.Command)
		assert.Equal(t, []string{"-v", "-role=" + role, "-id=" + id, "-restart=0"}, ct.Args)
		env := map[string]corev1.EnvVar{}
		for _, v := range ct.Env {
			env[v.Name] = v
		}
		sec := env["ELASTICPS_SECRET"]
		assert.Empty(t, sec.Value, "the secret is never a value in the spec")
		if assert.NotNil(t, sec.ValueFrom) && assert.NotNil(t, sec.ValueFrom.SecretKeyRef) {
			assert.Equal(t, cfg.Secret, *sec.ValueFrom.SecretKeyRef)
		}
		assert.Equal(t, "bar", env["FOO"].Value, "the template's env is kept")
		assert.Equal(t, id, env["ELASTICPS_NODE_ID"].Value)
		assert.Equal(t, role, env["ELASTICPS_ROLE"].Value)
		assert.Equal(t, "0", env["ELASTICPS_RESTART"].Value)
		assert.Equal(t, "status.podIP", env["POD_IP"].ValueFrom.FieldRef.FieldPath)
		assert.Equal(t, "metadata.name", env["POD_NAME"].ValueFrom.FieldRef.FieldPath)
		if id == "ps-0" {
			assert.Equal(t, addr, env["ELASTICPS_ADDR"].Value)
			assert.Equal(t, []corev1.ContainerPort{{Name: "ps", ContainerPort: 7070, Protocol: corev1.ProtocolTCP}}, ct.Ports)
			want := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("2Gi")}
			assert.True(t, equalResources(want, ct.Resources.Requests), "requests %v", ct.Resources.Requests)
			assert.True(t, equalResources(want, ct.Resources.Limits), "limits %v", ct.Resources.Limits)
			assert.Equal(t, "limits.memory", env["GOMEMLIMIT"].ValueFrom.ResourceFieldRef.Resource)
		} else {
			assert.NotContains(t, env, "ELASTICPS_ADDR")
			assert.Empty(t, ct.Ports)
			assert.True(t, equalResources(tpl.Spec.Containers[0].Resources.Requests, ct.Resources.Requests), "the template's size: %v", ct.Resources)
			assert.Empty(t, ct.Resources.Limits)
			assert.NotContains(t, env, "GOMEMLIMIT", "no limit to follow")
		}
		for _, a := range append(ct.Command, ct.Args...) {
			assert.NotContains(t, strings.ToLower(a), "secret")
		}
	}

	svc, err := client.CoreV1().Services(e.ns).Get(ctx, "layout", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, corev1.ClusterIPNone, svc.Spec.ClusterIP)
	assert.True(t, svc.Spec.PublishNotReadyAddresses)
	assert.Equal(t, map[string]string{"elasticps.io/job": "layout"}, svc.Spec.Selector)
	require.Len(t, svc.Spec.Ports, 1)
	assert.Equal(t, "ps", svc.Spec.Ports[0].Name)
	assert.Equal(t, int32(7070), svc.Spec.Ports[0].Port)
	assert.Equal(t, intstr.FromString("ps"), svc.Spec.Ports[0].TargetPort)
	assert.Equal(t, "layout", svc.Labels["elasticps.io/job"])
	assert.Equal(t, []metav1.OwnerReference{ref}, svc.OwnerReferences)

	// A scaler of the same job adopts the Service; one of a name taken by another Service fails.
	again, err := kube.New(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, again.Close())
	_, err = client.CoreV1().Services(e.ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "taken"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg.Job = "taken"
	_, err = kube.New(ctx, cfg)
	assert.ErrorIs(t, err, kube.ErrConflict)
}

func equalResources(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, q := range a {
		if r, ok := b[k]; !ok || q.Cmp(r) != 0 {
			return false
		}
	}
	return true
}

// A Scale down deletes the highest-numbered workers with the grace period, and returns only
// once their pods are gone.
func TestScaleInDeletesGracefully(t *testing.T) {
	e := newEnv(t, nil)
	rep := &reporter{}
	s, rec := e.scaler(e.config("drain"))
	s.SetReporter(rep)
	require.NoError(t, s.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 3}))

	e.kubelet.hold() // the programs take their time to leave
	ctx, cancel := context.WithCancel(e.ctx)
	scaled := make(chan error, 1)
	go func() { scaled <- s.Scale(ctx, elastic.Plan{Servers: 1, Workers: 1}) }()
	for _, id := range []string{"worker-2", "worker-1"} {
		p, err := e.cp.WaitPod(e.ctx, e.ns, kube.PodName("drain", id), func(p *corev1.Pod) bool { return p.DeletionTimestamp != nil })
		require.NoError(t, err)
		assert.Equal(t, int64(5), *p.DeletionGracePeriodSeconds, "deleted with StopGrace")
	}
	cancel()
	require.ErrorIs(t, <-scaled, context.Canceled, "Scale waits while the deleted pods are there")
	assert.Nil(t, e.pod("drain", "worker-0").DeletionTimestamp, "worker-0 stays")
	assert.NotNil(t, e.pod("drain", "worker-2").DeletionTimestamp, "the pod is still there, being deleted")
	assert.Equal(t, elastic.Plan{Servers: 1, Workers: 1}, s.Plan())

	e.kubelet.release()
	for _, id := range []string{"worker-2", "worker-1"} {
		ev, err := rec.await(e.ctx, id, kube.EventStopped)
		require.NoError(t, err)
		assert.True(t, ev.Final)
		_, err = e.cp.Client.CoreV1().Pods(e.ns).Get(e.ctx, kube.PodName("drain", id), metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "%s is gone: %v", id, err)
	}
	// Without a hold, Scale returns once the pod is gone.
	require.NoError(t, s.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 0}))
	_, err := e.cp.Client.CoreV1().Pods(e.ns).Get(e.ctx, kube.PodName("drain", "worker-0"), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "worker-0 is gone when Scale returns: %v", err)
	assert.Empty(t, rep.told(), "a stop is not a failure")
	var ids []string
	for _, p := range s.Pods() {
		ids = append(ids, p.ID)
	}
	assert.Equal(t, []string{"ps-0"}, ids)
}

// An OOM-killed server is reported and replaced with more memory (capped at MaxMemory), until
// its restarts run out.
func TestOOMKilledServerGetsMoreMemory(t *testing.T) {
	e := newEnv(t, nil)
	rep := &reporter{}
	cfg := e.config("oom")
	cfg.MaxRestarts, cfg.MaxMemory = 2, 100<<20
	s, rec := e.scaler(cfg)
	s.SetReporter(rep)
	require.NoError(t, s.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 1, Server: elastic.Resources{Memory: 64 << 20}}))
	name := kube.PodName("oom", "ps-0")
	first := e.pod("oom", "ps-0")

	require.NoError(t, e.kubelet.end(e.ctx, e.ns, name, oomKill))
	ev, err := rec.await(e.ctx, "ps-0", kube.EventOOMKilled)
	require.NoError(t, err)
	assert.Equal(t, int64(64<<20), ev.MemoryLimit, "the limit it went over")
	assert.Equal(t, int32(137), ev.ExitCode)
	assert.Equal(t, first.UID, ev.UID)
	assert.False(t, ev.Final)
	require.Len(t, rep.told(), 1)
	assert.Contains(t, rep.told()[0], "server ps-0: pod oom-ps-0 OOMKilled")

	for _, step := range []struct {
		restart int
		memory  int64
	}{{1, 96 << 20}, {2, 100 << 20}} {
		run := awaitRunning(t, rec, "ps-0", step.restart)
		assert.Equal(t, step.memory, run.Size.Memory)
		p := e.pod("oom", "ps-0")
		assert.Equal(t, run.UID, p.UID)
		mem := resource.NewQuantity(step.memory, resource.BinarySI)
		assert.Zero(t, mem.Cmp(p.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]), "limit %v", p.Spec.Containers[0].Resources.Limits)
		assert.Zero(t, mem.Cmp(p.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory]), "request = limit")
		assert.Equal(t, strconv.Itoa(step.restart), p.Annotations["elasticps.io/restart"])
		if step.restart == 1 {
			require.NoError(t, e.kubelet.end(e.ctx, e.ns, name, oomKill))
		}
	}
	status := podStatus(s, "ps-0")
	assert.Equal(t, 2, status.Restarts)
	assert.True(t, status.Running)

	// The restarts are used up: the next end is final, and no pod replaces it.
	last := e.pod("oom", "ps-0")
	require.NoError(t, e.kubelet.end(e.ctx, e.ns, name, crash))
	evs := awaitFinal(t, rec, "ps-0")
	assert.Equal(t, kube.EventExited, evs.Kind)
	assert.Equal(t, int32(137), evs.ExitCode)
	status = podStatus(s, "ps-0")
	assert.True(t, status.Done)
	assert.False(t, status.Running)
	assert.ErrorIs(t, status.Err, kube.ErrRestartLimit)
	assert.Equal(t, kube.EventExited, status.Last.Kind)
	list, err := e.cp.Client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: "elasticps.io/node=ps-0"})
	require.NoError(t, err)
	require.Len(t, list.Items, 1, "no new pod")
	assert.Equal(t, last.UID, list.Items[0].UID, "the failed pod stays, for its logs")
	assert.Equal(t, corev1.PodFailed, list.Items[0].Status.Phase)
	assert.Len(t, rep.told(), 3, "every end of a server is reported")
	w := podStatus(s, "worker-0")
	assert.True(t, w.Running, "the worker is not touched")
	assert.Zero(t, w.Restarts)

	require.NoError(t, s.Close())
	list, err = e.cp.Client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, list.Items, "Close deletes every pod, the failed one too")
	assertNoScalerGoroutines(t)
}

// assertNoScalerGoroutines checks that no goroutine runs the package's code: Close joined them.
func assertNoScalerGoroutines(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		assert.NotContains(t, g, "elasticps/elastic/kube.", "a goroutine of the scaler outlived Close")
	}
}

// awaitRunning waits for node id's EventRunning of restart.
func awaitRunning(t *testing.T, rec *recorder, id string, restart int) kube.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for {
		ch := rec.changes()
		for _, ev := range rec.of(id) {
			if ev.Kind == kube.EventRunning && ev.Restart == restart {
				return ev
			}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("%s restart %d never ran: %v", id, restart, rec.of(id))
		}
	}
}

// awaitFinal waits for node id's final event.
func awaitFinal(t *testing.T, rec *recorder, id string) kube.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for {
		ch := rec.changes()
		for _, ev := range rec.of(id) {
			if ev.Final {
				return ev
			}
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("%s never ended for good: %v", id, rec.of(id))
		}
	}
}

func podStatus(s *kube.Scaler, id string) kube.PodStatus {
	for _, p := range s.Pods() {
		if p.ID == id {
			return p
		}
	}
	return kube.PodStatus{}
}

// A worker evicted or deleted behind the scaler's back is reported and replaced; one that
// exits with status 0 is done.
func TestWorkerEnds(t *testing.T) {
	e := newEnv(t, nil)
	rep := &reporter{}
	cfg := e.config("ends")
	cfg.MaxRestarts = 3
	s, rec := e.scaler(cfg)
	s.SetReporter(rep)
	plan := elastic.Plan{Workers: 3}
	require.NoError(t, s.Scale(e.ctx, plan))

	require.NoError(t, e.kubelet.end(e.ctx, e.ns, kube.PodName("ends", "worker-0"), eviction))
	ev, err := rec.await(e.ctx, "worker-0", kube.EventEvicted)
	require.NoError(t, err)
	assert.Equal(t, "Evicted", ev.Reason)
	assert.Contains(t, ev.Message, "low on resource")
	awaitRunning(t, rec, "worker-0", 1)

	require.NoError(t, e.cp.Client.CoreV1().Pods(e.ns).Delete(e.ctx, kube.PodName("ends", "worker-1"), metav1.DeleteOptions{}))
	_, err = rec.await(e.ctx, "worker-1", kube.EventDeleted)
	require.NoError(t, err)
	awaitRunning(t, rec, "worker-1", 1)
	told := rep.told()
	require.Len(t, told, 2)
	assert.Contains(t, told[0], "worker worker-0: pod ends-worker-0 Evicted")
	assert.Contains(t, told[1], "worker worker-1: pod ends-worker-1 Deleted")

	require.NoError(t, e.kubelet.end(e.ctx, e.ns, kube.PodName("ends", "worker-2"), done))
	final := awaitFinal(t, rec, "worker-2")
	assert.Equal(t, kube.EventExited, final.Kind)
	assert.Zero(t, final.ExitCode)
	st := podStatus(s, "worker-2")
	assert.True(t, st.Done)
	assert.NoError(t, st.Err)
	assert.Len(t, rep.told(), 2, "a worker done with its data is no failure")
	require.NoError(t, s.Scale(e.ctx, plan), "the same plan again")
	assert.True(t, podStatus(s, "worker-2").Done, "a done worker is not started again")
	assert.Zero(t, podStatus(s, "worker-2").Restarts)
}

// A pod that finds no node fails its start with the scheduler's reason once PendingTimeout has
// passed, and is deleted; a later Scale tries the node id again.
func TestPendingPodFailsItsStart(t *testing.T) {
	e := newEnv(t, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("1Gi")})
	cfg := e.config("pending")
	cfg.PendingTimeout = 2 * time.Second
	s, rec := e.scaler(cfg)
	require.NoError(t, s.Scale(e.ctx, elastic.Plan{Servers: 1, Server: elastic.Resources{Memory: 256 << 20}}))

	big := elastic.Plan{Servers: 1, Server: elastic.Resources{Memory: 64 << 30}}
	require.NoError(t, s.Scale(e.ctx, big), "new sizes apply to the pods started from then on")
	start := time.Now()
	added, err := s.StartServers(e.ctx, 1)
	took := time.Since(start)
	require.ErrorIs(t, err, kube.ErrPending)
	assert.Contains(t, err.Error(), "Insufficient memory")
	assert.Empty(t, added)
	assert.GreaterOrEqual(t, took, cfg.PendingTimeout)
	assert.Less(t, took, cfg.PendingTimeout+10*time.Second)
	ev, err := rec.await(e.ctx, "ps-1", kube.EventPending)
	require.NoError(t, err)
	assert.Equal(t, "Unschedulable", ev.Reason)
	assert.Contains(t, ev.Message, "Insufficient memory")
	assert.True(t, ev.Final)
	_, err = e.cp.Client.CoreV1().Pods(e.ns).Get(e.ctx, kube.PodName("pending", "ps-1"), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the pending pod is deleted: %v", err)
	assert.Equal(t, 1, s.Plan().Servers, "the failed start is undone")
	assert.Len(t, s.Pods(), 1)

	// A worker too big: Scale fails alike; a smaller one is started at the next Scale.
	err = s.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 1, Worker: elastic.Resources{Memory: 64 << 30}})
	require.ErrorIs(t, err, kube.ErrPending)
	st := podStatus(s, "worker-0")
	assert.True(t, st.Done)
	assert.ErrorIs(t, st.Err, kube.ErrPending)
	require.NoError(t, s.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 1, Worker: elastic.Resources{Memory: 128 << 20}}))
	assert.True(t, podStatus(s, "worker-0").Running)
}

// A pod the apiserver refuses to create fails the Scale with the refusal; the next Scale tries
// the node id again.
func TestRefusedPod(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config("refused")
	cfg.Template.Spec.ServiceAccountName = "missing"
	s, rec := e.scaler(cfg)
	err := s.Scale(e.ctx, elastic.Plan{Workers: 1})
	require.Error(t, err)
	assert.True(t, apierrors.IsForbidden(err), "the admission's refusal: %v", err)
	ev, err := rec.await(e.ctx, "worker-0", kube.EventRefused)
	require.NoError(t, err)
	assert.Contains(t, ev.Message, `serviceaccount "missing" not found`)
	assert.True(t, ev.Final)
	assert.True(t, podStatus(s, "worker-0").Done)

	_, err = e.cp.Client.CoreV1().ServiceAccounts(e.ns).Create(e.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "missing"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.NoError(t, s.Scale(e.ctx, elastic.Plan{Workers: 1}))
	assert.True(t, podStatus(s, "worker-0").Running)
}
