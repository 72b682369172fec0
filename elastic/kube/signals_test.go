package kube_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
	"github.com/elasticps/elasticps/elastic/kube"
)

// A worker no node can hold is listed by Pending with its size and the scheduler's reason (and
// an Unschedulable event); a Scale that makes the workers smaller asks for it again at the new
// size, the same incarnation, and the Scale that started it returns once that one runs.
func TestPendingPodIsAskedForAgainSmaller(t *testing.T) {
	e := newEnv(t, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("1Gi")})
	cfg := e.config("shrink")
	s, rec := e.scaler(cfg)
	big := elastic.Plan{Workers: 1, Worker: elastic.Resources{Memory: 2 << 30}}
	first := make(chan error, 1)
	go func() { first <- s.Scale(e.ctx, big) }()

	ev, err := rec.await(e.ctx, "worker-0", kube.EventUnschedulable)
	require.NoError(t, err)
	assert.Contains(t, ev.Message, "Insufficient memory")
	assert.False(t, ev.Final)
	pending := s.Pending()
	require.Len(t, pending, 1)
	assert.Equal(t, "worker-0", pending[0].ID)
	assert.Equal(t, autoscale.Worker, pending[0].Role)
	assert.Equal(t, int64(2<<30), pending[0].Size.Memory)
	assert.Contains(t, pending[0].Reason, "Insufficient memory")
	assert.Positive(t, pending[0].Waited)

	small := big
	small.Worker.Memory = 256 << 20
	require.NoError(t, s.Scale(e.ctx, small), "a resize is not waited for")
	select {
	case err := <-first:
		require.NoError(t, err, "the first Scale's worker runs, at the new size")
	case <-e.ctx.Done():
		t.Fatal("the worker never ran")
	}
	run := awaitRunning(t, rec, "worker-0", 0)
	assert.Equal(t, int64(256<<20), run.Size.Memory)
	p := e.pod("shrink", "worker-0")
	assert.Zero(t, resource.NewQuantity(256<<20, resource.BinarySI).Cmp(p.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]))
	assert.Equal(t, "0", p.Annotations["elasticps.io/restart"], "a pod that never ran: the same incarnation")
	assert.Empty(t, s.Pending())
}

// An OOM kill of a server is handed to OOMKills once, with the limit it went over. A
// RestartServer at a plan size the scaler's own replacement already has does nothing; one at a
// larger size restarts the server's pod with it, as a new incarnation, and tells the Reporter.
func TestOOMKillsAndRestartServer(t *testing.T) {
	e := newEnv(t, nil)
	rep := &reporter{}
	cfg := e.config("restart")
	cfg.MaxRestarts = 3
	s, rec := e.scaler(cfg)
	s.SetReporter(rep)
	plan := elastic.Plan{Servers: 1, Server: elastic.Resources{Memory: 64 << 20}}
	require.NoError(t, s.Scale(e.ctx, plan))
	assert.Empty(t, s.OOMKills())

	require.NoError(t, e.kubelet.end(e.ctx, e.ns, kube.PodName("restart", "ps-0"), oomKill))
	awaitRunning(t, rec, "ps-0", 1)
	assert.Equal(t, []autoscale.OOMKill{{ID: "ps-0", MemoryLimit: 64 << 20}}, s.OOMKills())
	assert.Empty(t, s.OOMKills(), "each kill once")

	plan.Server.Memory = 96 << 20 // what an autoscaler asks: 1.5 times the limit
	require.NoError(t, s.Scale(e.ctx, plan))
	require.NoError(t, s.RestartServer(e.ctx, "ps-0", "killed for lack of memory"))
	assert.Zero(t, podStatus(s, "ps-0").Resize, "the replacement is as large: no restart asked for")
	assert.Equal(t, 1, podStatus(s, "ps-0").Restarts)
	require.Len(t, rep.told(), 1)

	plan.Server.Memory = 128 << 20
	require.NoError(t, s.Scale(e.ctx, plan))
	require.NoError(t, s.RestartServer(e.ctx, "ps-0", "near its limit"))
	if st := podStatus(s, "ps-0"); st.Restarts == 1 {
		assert.Equal(t, int64(128<<20), st.Resize.Memory, "a restart asked for at the plan's size")
	}
	run := awaitRunning(t, rec, "ps-0", 2)
	assert.Equal(t, int64(128<<20), run.Size.Memory)
	p := e.pod("restart", "ps-0")
	assert.Zero(t, resource.NewQuantity(128<<20, resource.BinarySI).Cmp(p.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]))
	require.Len(t, rep.told(), 2, "told before the new pod is made")
	assert.Contains(t, rep.told()[1], "server ps-0: pod restart-ps-0 restarted with")
	assert.Empty(t, s.OOMKills(), "a restart is no kill")

	require.ErrorIs(t, s.RestartServer(context.Background(), "ps-7", "none"), elastic.ErrInvalidConfig)
}

// The scaler's growth after an OOM kill is rounded up to a whole MiB, as the autoscaler's is,
// so that an autoscaler's restart at MemoryGrowth times a limit of no whole MiB finds the
// replacement as large.
func TestOOMGrowthAgreesWithTheAutoscaler(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.config("agree")
	cfg.MaxRestarts = 2
	s, rec := e.scaler(cfg)
	plan := elastic.Plan{Servers: 1, Server: elastic.Resources{Memory: 100e6}}
	require.NoError(t, s.Scale(e.ctx, plan))
	require.NoError(t, e.kubelet.end(e.ctx, e.ns, kube.PodName("agree", "ps-0"), oomKill))
	run := awaitRunning(t, rec, "ps-0", 1)
	assert.Equal(t, int64(144<<20), run.Size.Memory, "1.5e8 bytes rounded up to a whole MiB")

	plan.Server.Memory = 144 << 20 // autoscale's roundMiB(1.5 x 1e8)
	require.NoError(t, s.Scale(e.ctx, plan))
	require.NoError(t, s.RestartServer(e.ctx, "ps-0", "killed for lack of memory"))
	assert.Zero(t, podStatus(s, "ps-0").Resize, "no second restart asked for")
	assert.Equal(t, 1, podStatus(s, "ps-0").Restarts)
}

// A Scale that leaves a role's size as it was does not ask again for that role's pods: a
// server's replacement grown after an OOM kill and still pending keeps its size whatever the
// workers' plan does.
func TestScaleKeepsAGrownPendingServer(t *testing.T) {
	e := newEnv(t, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("1Gi")})
	cfg := e.config("grown")
	cfg.MaxRestarts = 2
	s, rec := e.scaler(cfg)
	plan := elastic.Plan{Servers: 1, Server: elastic.Resources{Memory: 800 << 20}}
	require.NoError(t, s.Scale(e.ctx, plan))
	require.NoError(t, e.kubelet.end(e.ctx, e.ns, kube.PodName("grown", "ps-0"), oomKill))
	ev, err := rec.await(e.ctx, "ps-0", kube.EventUnschedulable) // 1.5 x 800 MiB: no node holds it
	require.NoError(t, err)
	assert.Equal(t, int64(1200<<20), ev.Size.Memory)

	plan.Workers = 1
	require.NoError(t, s.Scale(e.ctx, plan))
	st := podStatus(s, "ps-0")
	assert.Zero(t, st.Resize, "the server's size is the plan's as before: not asked for again")
	assert.Equal(t, int64(1200<<20), st.Size.Memory)
}
