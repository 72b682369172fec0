package kube_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
)

// A scaler of a job whose pods an earlier scaler left (its coordinator died) adopts those that
// run and replaces those that ended; Leave hands them all to the next scaler untouched, and
// Close, at the job's end, deletes them all, adopted or not.
func TestAdoptsTheJobsRunningPods(t *testing.T) {
	e := newEnv(t, nil)
	// The earlier scaler may not delete pods, so its Close leaves them as a dead coordinator's
	// scaler would.
	cfg := e.config("adopt")
	cfg.Client = e.apply(withoutDelete(readRBAC(t)))
	before, _ := e.scaler(cfg)
	require.NoError(t, before.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 2}))
	assert.True(t, apierrors.IsForbidden(before.Close()))
	server, worker, ended := e.pod("adopt", "ps-0"), e.pod("adopt", "worker-0"), e.pod("adopt", "worker-1")
	require.NoError(t, e.kubelet.end(e.ctx, e.ns, kube.PodName("adopt", "worker-1"), crash))

	cfg.Client = e.cp.Client
	s, rec := e.scaler(cfg)
	require.NoError(t, s.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 2}))
	uids := map[string]string{}
	for _, p := range s.Pods() {
		assert.True(t, p.Running, p.ID)
		uids[p.ID] = string(p.UID)
	}
	assert.Equal(t, string(server.UID), uids["ps-0"], "adopted")
	assert.Equal(t, string(worker.UID), uids["worker-0"], "adopted")
	assert.NotEqual(t, string(ended.UID), uids["worker-1"], "the ended pod is replaced")
	run, err := rec.await(e.ctx, "worker-1", kube.EventRunning)
	require.NoError(t, err)
	assert.Zero(t, run.Restart, "a new pod of the plan, not a restart")

	s.Leave()
	assert.ErrorIs(t, s.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 1}), elastic.ErrClosed)
	assert.NoError(t, s.Close(), "Close after Leave does nothing")
	for _, id := range []string{"ps-0", "worker-0", "worker-1"} {
		p, err := e.cp.Client.CoreV1().Pods(e.ns).Get(e.ctx, kube.PodName("adopt", id), metav1.GetOptions{})
		require.NoError(t, err, "%s runs on after Leave", id)
		assert.Nil(t, p.DeletionTimestamp, id)
	}

	last, _ := e.scaler(cfg)
	require.NoError(t, last.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 2}))
	require.NoError(t, last.Close())
	for _, id := range []string{"ps-0", "worker-0", "worker-1"} {
		_, err := e.cp.Client.CoreV1().Pods(e.ns).Get(e.ctx, kube.PodName("adopt", id), metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "%s deleted at the job's end: %v", id, err)
	}
}
