package k8s_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/internal/kubetest"
)

// coordinatorReady waits until the Job's coordinator pod is Ready (it serves its control port)
// and returns it.
func coordinatorReady(t *testing.T, ctx context.Context, cp *kubetest.ControlPlane, ns, job string) *corev1.Pod {
	t.Helper()
	pods := cp.Client.CoreV1().Pods(ns)
	sel := metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job}
	w, err := pods.Watch(ctx, sel)
	require.NoError(t, err)
	defer w.Stop()
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted && ready(p) {
			return p
		}
	}
	t.Fatalf("the coordinator of job %s/%s was never ready: %v", ns, job, ctx.Err())
	return nil
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// A running job goes from 2 to 3 servers and back, and from 2 workers to 1, through its
// coordinator's control port (what dlrm scale -ps 3 -workers 2 does): the coordinator starts
// the new server's pod and moves slots onto it; scaling in, it moves every slot off the server
// before it deletes the pod. The job trains on to its end, every position exactly once.
func TestJobScalesOutAndInWhileItTrains(t *testing.T) {
	cp, node, ctx, ns := start(t, "scale")
	job, secret := deploy(t, ctx, cp, ns, map[string]string{"-train-records": "40000", "-epochs": "3"})
	coord := coordinatorReady(t, ctx, cp, ns, job)
	ctl, err := remote.NewControl(remote.Config{Addr: net.JoinHostPort(coord.Status.PodIP, "7071"), Secret: secret})
	require.NoError(t, err)
	defer ctl.Close()

	// At each deletion of a pod of the job, the slots the coordinator's owner table gives the
	// pod's server then.
	var (
		mu        sync.Mutex
		atDelete  = map[string]int{}
		deleteSaw = map[string]bool{}
	)
	w, err := cp.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + job})
	require.NoError(t, err)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || p.DeletionTimestamp == nil || p.Labels[kube.LabelRole] != "ps" {
				continue
			}
			mu.Lock()
			seen := deleteSaw[p.Name]
			deleteSaw[p.Name] = true
			mu.Unlock()
			if seen {
				continue
			}
			st, err := ctl.Status(ctx)
			if err != nil {
				continue
			}
			owned := 0
			for _, o := range st.Owners {
				if o == p.Labels[kube.LabelNode] {
					owned++
				}
			}
			mu.Lock()
			atDelete[p.Labels[kube.LabelNode]] = owned
			mu.Unlock()
		}
	}()

	require.NoError(t, ctl.SetPlan(ctx, elastic.Plan{Servers: 3, Workers: 2}), podLogs(context.WithoutCancel(ctx), cp, node, ns))
	st, err := ctl.Status(ctx)
	require.NoError(t, err)
	assert.Contains(t, st.Owners, "ps-2", "slots moved onto the new server")
	_, err = cp.Client.CoreV1().Pods(ns).Get(ctx, kube.PodName(job, "ps-2"), metav1.GetOptions{})
	require.NoError(t, err, "the new server runs as a pod")

	require.NoError(t, ctl.SetPlan(ctx, elastic.Plan{Servers: 2, Workers: 1}), podLogs(context.WithoutCancel(ctx), cp, node, ns))
	st, err = ctl.Status(ctx)
	require.NoError(t, err)
	assert.NotContains(t, st.Owners, "ps-2")
	assert.Equal(t, 2, len(st.Servers))
	for _, id := range []string{"ps-2", "worker-1"} {
		_, err = cp.Client.CoreV1().Pods(ns).Get(ctx, kube.PodName(job, id), metav1.GetOptions{})
		assert.Error(t, err, "%s's pod is gone once the plan is in place", id)
	}

	done, err := waitJob(ctx, cp, ns, job)
	w.Stop()
	<-watched
	require.NoError(t, err, podLogs(context.WithoutCancel(ctx), cp, node, ns))
	require.Equal(t, int32(1), done.Status.Succeeded, "the Job succeeded\n%s", podLogs(context.WithoutCancel(ctx), cp, node, ns))
	out := node.Logs(ns, coord.Name)
	assert.Contains(t, out, "every position of every epoch covered exactly once", out)

	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, atDelete, "ps-2", "the watch saw ps-2's deletion")
	assert.Zero(t, atDelete["ps-2"], "ps-2 owned no slot when its pod was deleted: drained first")
}
