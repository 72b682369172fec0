package k8s_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/internal/kubetest"
	"github.com/elasticps/elasticps/internal/wait"
)

// statusEvery is how often awaitStatus asks the coordinator for its status: the control port
// has no call that waits.
const statusEvery = 100 * time.Millisecond

// awaitStatus asks the coordinator for its status until cond holds of it, and returns it.
func awaitStatus(t *testing.T, ctx context.Context, ctl *remote.Control, what string, cond func(elastic.Status) bool) elastic.Status {
	t.Helper()
	for {
		st, err := ctl.Status(ctx)
		if err == nil && cond(st) {
			return st
		}
		require.NoError(t, wait.Sleep(ctx, statusEvery), "waiting for %s (last: %v)", what, err)
	}
}

// A server's pod and a worker's pod deleted while the job trains (kubectl delete pod, a node
// drained) come back under their names as new incarnations: the coordinator hears of the
// server's end from the scaler at once and, once the new server serves, rolls the job back to
// its newest commit (Rollback) or restores the server's slots alone (Partial); the job trains on
// to its end with every position trained exactly once.
func TestJobRecoversFromDeletedPods(t *testing.T) {
	for _, policy := range []elastic.RecoveryPolicy{elastic.Rollback, elastic.Partial} {
		t.Run(policy.String(), func(t *testing.T) { recoverFromDeletedPods(t, policy) })
	}
}

func recoverFromDeletedPods(t *testing.T, policy elastic.RecoveryPolicy) {
	cp, node, ctx, ns := start(t, "recover-"+strings.ToLower(policy.String()))
	job, secret := deploy(t, ctx, cp, ns, map[string]string{"-train-records": "40000", "-epochs": "3", "-recovery": strings.ToLower(policy.String())})
	coord := coordinatorReady(t, ctx, cp, ns, job)
	ctl, err := remote.NewControl(remote.Config{Addr: net.JoinHostPort(coord.Status.PodIP, "7071"), Secret: secret})
	require.NoError(t, err)
	defer ctl.Close()
	logs := func() string { return podLogs(context.WithoutCancel(ctx), cp, node, ns) }

	pods := cp.Client.CoreV1().Pods(ns)
	before := map[string]*corev1.Pod{}
	for _, id := range []string{"ps-1", "worker-0"} {
		p, err := pods.Get(ctx, kube.PodName(job, id), metav1.GetOptions{})
		require.NoError(t, err)
		before[id] = p
	}
	awaitStatus(t, ctx, ctl, "a commit to roll back to", func(st elastic.Status) bool { return st.Commits > 0 && st.Step >= 30 })
	for _, id := range []string{"ps-1", "worker-0"} {
		require.NoError(t, pods.Delete(ctx, before[id].Name, metav1.DeleteOptions{}))
	}
	for _, id := range []string{"ps-1", "worker-0"} {
		var p *corev1.Pod
		for err = kubetest.ErrPodDeleted; errors.Is(err, kubetest.ErrPodDeleted); { // the old pod goes first
			p, err = cp.WaitPod(ctx, ns, before[id].Name, func(p *corev1.Pod) bool {
				return p.UID != before[id].UID && p.Status.Phase == corev1.PodRunning
			})
		}
		require.NoError(t, err, "%s comes back\n%s", id, logs())
		assert.Equal(t, "1", p.Annotations[kube.AnnotationRestart], "%s's new pod is its first restart", id)
	}

	st := awaitStatus(t, ctx, ctl, "the recovery", func(st elastic.Status) bool { return st.Recoveries > 0 })
	require.NotNil(t, st.LastRecovery)
	assert.Contains(t, st.LastRecovery.Failed, "ps-1", "the recovery was of the deleted server")
	assert.Equal(t, policy, st.LastRecovery.Policy)

	done, err := waitJob(ctx, cp, ns, job)
	require.NoError(t, err, logs())
	require.Equal(t, int32(1), done.Status.Succeeded, "the Job succeeded\n%s", logs())
	out := node.Logs(ns, coord.Name)
	// Partial may lose the updates of the positions trained on the server's slots between the
	// commit and the restore: the summary then counts them beside the verdict.
	assert.Contains(t, out, "every position", out)
	assert.Contains(t, out, "covered exactly once", out)
	assert.NotContains(t, out, "FAILED", out)
}
