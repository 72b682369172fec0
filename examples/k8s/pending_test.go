package k8s_test

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/internal/kubetest"
)

// startSmall is start with a node of the given memory (and 16 cores).
func startSmall(t *testing.T, name string, memory string) (*kubetest.ControlPlane, *kubetest.Node, context.Context, string) {
	t.Helper()
	name = fmt.Sprintf("%s-%d", name, runs.Add(1))
	cp := cluster.Get(t)
	bin := dlrmBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), jobTimeout)
	t.Cleanup(cancel)
	node := cp.StartNode(t, name, kubetest.NodeOptions{
		Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse(memory)},
		Images:   map[string]string{image: bin},
	})
	return cp, node, ctx, name
}

// A worker whose memory request no node can hold stays Pending, and the scheduler says why
// ("Insufficient memory"): the node has room for the coordinator (512 MiB asked), two servers
// of 256 MiB and one worker of 512 MiB, not two. The coordinator's autoscaler, told by the
// scaler, gives a worker up once one has waited -pending-for (the planner's first answer: a
// worker costs nothing to add back later), the plan goes to one worker, and the job trains to
// its end with it, every position exactly once. The coordinator starts its workers one at a
// time, so the one that finds no room is worker-1, which a plan of one worker gives up: its
// pending pod is deleted.
func TestPendingWorkerIsGivenUp(t *testing.T) {
	cp, node, ctx, ns := startSmall(t, "pending", "1792Mi")
	job, secret := deploy(t, ctx, cp, ns, map[string]string{"-ps-memory": "256Mi", "-worker-memory": "512Mi",
		"-autoscale": "true", "-autoscale-every": "1s", "-pending-for": "3s", "-train-records": "30000"})
	logs := func() string { return podLogs(context.WithoutCancel(ctx), cp, node, ns) }

	pending, err := awaitPod(ctx, cp, ns, kube.LabelRole+"=worker", func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true
			}
		}
		return false
	})
	require.NoError(t, err, "a worker stays pending\n%s", logs())
	said := ""
	for _, c := range pending.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			said = c.Message
		}
	}
	assert.Contains(t, said, "Insufficient memory")
	id := pending.Labels[kube.LabelNode]
	assert.Equal(t, "worker-1", id, "the workers start in order: the last one finds no room")

	coord := coordinatorReady(t, ctx, cp, ns, job)
	ctl, err := remote.NewControl(remote.Config{Addr: net.JoinHostPort(coord.Status.PodIP, "7071"), Secret: secret})
	require.NoError(t, err)
	defer ctl.Close()
	st := awaitStatus(t, ctx, ctl, "the plan without the pending worker", func(st elastic.Status) bool { return st.Plan.Workers == 1 })
	assert.Equal(t, 2, st.Plan.Servers)
	assert.Equal(t, int64(512<<20), st.Plan.Worker.Memory, "the workers' size is kept: the pending one is given up, not shrunk")
	_, err = cp.Client.CoreV1().Pods(ns).Get(ctx, pending.Name, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the pending pod is deleted once the plan is in place: %v", err)
	w0, err := cp.Client.CoreV1().Pods(ns).Get(ctx, kube.PodName(job, "worker-0"), metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "0", w0.Annotations[kube.AnnotationRestart], "worker-0 ran on, never stopped")

	done, err := waitJob(ctx, cp, ns, job)
	require.NoError(t, err, logs())
	require.Equal(t, int32(1), done.Status.Succeeded, "the Job succeeded\n%s", logs())
	out := node.Logs(ns, coord.Name)
	assert.Contains(t, out, "every position of every epoch covered exactly once", out)
	assert.Contains(t, out, fmt.Sprintf("autoscale: pods: pod %s Unschedulable", pending.Name), out)
	assert.Contains(t, out, fmt.Sprintf("autoscale: shrink-request %s: pending for", id), out)
	assert.Contains(t, out, "give it up, 1 workers", out)
	t.Logf("the scheduler said: %s", said)
	assert.Contains(t, out, "the scheduler: 0/1 nodes are available: 1 Insufficient memory.", out)
}
