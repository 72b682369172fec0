package k8s_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/internal/kubetest"
)

// The coordinator's pod deleted while the job trains (kubectl delete pod, a node drained): the
// coordinator hands the job over (it stops acting for it, leaves its servers and workers
// running and releases the Lease), the Job starts another coordinator pod, which takes the
// Lease, adopts the running servers and workers (the same pods) and takes the job over from its
// newest commit; the job trains to its end, every position exactly once, and the Job succeeds,
// the hand-over not counted as a failure.
func TestJobSurvivesItsCoordinatorPodDeleted(t *testing.T) {
	cp, node, ctx, ns := start(t, "takeover")
	job, secret := deploy(t, ctx, cp, ns, map[string]string{"-train-records": "40000", "-epochs": "3"})
	logs := func() string { return podLogs(context.WithoutCancel(ctx), cp, node, ns) }
	lease := job + "-coordinator"
	old := coordinatorReady(t, ctx, cp, ns, job)
	ctl, err := remote.NewControl(remote.Config{Addr: net.JoinHostPort(old.Status.PodIP, "7071"), Secret: secret})
	require.NoError(t, err)
	defer ctl.Close()

	// Every pod of the job's servers and workers the watch sees, from the first on.
	nodes := []string{"ps-0", "ps-1", "worker-0", "worker-1"}
	var (
		mu   sync.Mutex
		seen = map[string][]types.UID{}
	)
	w, err := cp.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: kube.LabelRole + " in (ps,worker)," + kube.LabelJob + "=" + job})
	require.NoError(t, err)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				mu.Lock()
				seen[p.Labels[kube.LabelNode]] = append(seen[p.Labels[kube.LabelNode]], p.UID)
				mu.Unlock()
			}
		}
	}()
	// The Lease's holders, as the watch saw them change, each with the Lease as it was then.
	var (
		holders []string
		records []*coordinationv1.Lease
	)
	lw, err := cp.Client.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector(metav1.ObjectNameField, lease).String()})
	require.NoError(t, err)
	leaseWatched := make(chan struct{})
	go func() {
		defer close(leaseWatched)
		for ev := range lw.ResultChan() {
			if l, ok := ev.Object.(*coordinationv1.Lease); ok {
				h := holder(l)
				mu.Lock()
				if len(holders) == 0 || holders[len(holders)-1] != h {
					holders, records = append(holders, h), append(records, l)
				}
				mu.Unlock()
			}
		}
	}()

	awaitStatus(t, ctx, ctl, "a commit to take over from", func(st elastic.Status) bool { return st.Commits > 0 && st.Step >= 30 })
	before := map[string]types.UID{}
	for _, id := range nodes {
		p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, kube.PodName(job, id), metav1.GetOptions{})
		require.NoError(t, err, "%s runs as a pod", id)
		before[id] = p.UID
	}
	held, err := cp.Client.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
	require.NoError(t, err, "the coordinator holds the Lease %s", lease)
	require.Equal(t, old.Name, holder(held), "the first coordinator holds the Lease")

	// The old coordinator's pod as it ends.
	ended := make(chan *corev1.Pod, 1)
	go func() {
		p, err := cp.WaitPod(ctx, ns, old.Name, func(p *corev1.Pod) bool {
			return p.UID == old.UID && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded)
		})
		assert.NoError(t, err, "the old coordinator's pod ends")
		ended <- p
	}()
	deleted := time.Now()
	require.NoError(t, cp.Client.CoreV1().Pods(ns).Delete(ctx, old.Name, metav1.DeleteOptions{}))
	taken, err := awaitLease(ctx, cp, ns, lease, func(l *coordinationv1.Lease) bool { h := holder(l); return h != "" && h != old.Name })
	require.NoError(t, err, "another coordinator takes the Lease\n%s", logs())
	leads := time.Now()
	next, err := awaitCoordinator(ctx, cp, ns, job, func(p *corev1.Pod) bool { return p.Name == holder(taken) && ready(p) })
	require.NoError(t, err, "the Lease's new holder is the Job's new coordinator pod, and it gets ready\n%s", logs())
	require.NotEqual(t, old.UID, next.UID)
	assert.Greater(t, *taken.Spec.LeaseTransitions, *held.Spec.LeaseTransitions, "the Lease changed hands")

	ctl2, err := remote.NewControl(remote.Config{Addr: net.JoinHostPort(next.Status.PodIP, "7071"), Secret: secret})
	require.NoError(t, err)
	defer ctl2.Close()
	first := awaitStatus(t, ctx, ctl2, "the new coordinator", func(elastic.Status) bool { return true })
	awaitStatus(t, ctx, ctl2, "training on under the new coordinator", func(st elastic.Status) bool { return st.Step > first.Step })
	resumed := time.Now()
	t.Logf("takeover: the pod deleted → the new coordinator leads in %v → training resumes (from step %d) %v later; %v in all",
		leads.Sub(deleted).Round(time.Millisecond), first.Step, resumed.Sub(leads).Round(time.Millisecond), resumed.Sub(deleted).Round(time.Millisecond))

	done, err := waitJob(ctx, cp, ns, job)
	w.Stop()
	<-watched
	lw.Stop()
	<-leaseWatched
	require.NoError(t, err, logs())
	require.Equal(t, int32(1), done.Status.Succeeded, "the Job succeeded\n%s", logs())
	assert.Zero(t, done.Status.Failed, "the hand-over is no failure of the Job")

	out := node.Logs(ns, next.Name)
	assert.Contains(t, out, "taking it over from its newest commit", out)
	assert.Contains(t, out, "every position of every epoch covered exactly once", out)
	assert.Contains(t, out, "every epoch done", out)

	mu.Lock()
	defer mu.Unlock()
	for _, id := range nodes {
		assert.Equal(t, []types.UID{before[id]}, seen[id], "%s's pod was adopted, not replaced", id)
	}
	// Two coordinators never led at once: the first released the Lease (Lead does once its
	// coordinator has stopped) before the next acquired it, and its process had exited, having
	// handed the job over, before the Job even made the next pod.
	require.Equal(t, []string{old.Name, "", next.Name, ""}, holders,
		"the first coordinator released the Lease before the next took it, which released it at the job's end")
	released, acquired := records[1].Spec.RenewTime.Time, records[2].Spec.AcquireTime.Time
	assert.False(t, acquired.Before(released), "released at %v, acquired at %v", released, acquired)
	prev := <-ended
	require.NotNil(t, prev)
	require.Len(t, prev.Status.ContainerStatuses, 1)
	term := prev.Status.ContainerStatuses[0].State.Terminated
	require.NotNil(t, term, "the old coordinator's container ended")
	assert.Equal(t, int32(75), term.ExitCode, "the old coordinator exited as one that handed its job over\n%s", node.Logs(ns, old.Name))
	assert.False(t, next.CreationTimestamp.Time.Before(term.FinishedAt.Time.Truncate(time.Second)),
		"the old coordinator ended (%v) before the next pod was made (%v)", term.FinishedAt, next.CreationTimestamp)
	assert.Contains(t, node.Logs(ns, old.Name), "interrupted: the job goes on for the next coordinator")

	left, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelRole + " in (ps,worker)"})
	require.NoError(t, err)
	assert.Empty(t, left.Items, "the new coordinator deleted the servers and workers at the job's end")
}

// holder returns the holder of Lease l, "" if none.
func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// awaitCoordinator watches the coordinator pods of Job ns/job until cond holds of one, and
// returns it.
func awaitCoordinator(ctx context.Context, cp *kubetest.ControlPlane, ns, job string, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	pods := cp.Client.CoreV1().Pods(ns)
	sel := "batch.kubernetes.io/job-name=" + job
	for {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			if cond(&list.Items[i]) {
				return &list.Items[i], nil
			}
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return nil, err
		}
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted && cond(p) {
				w.Stop()
				return p, nil
			}
		}
		w.Stop()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}
