package kubetest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/elasticps/elasticps/internal/kubetest"
)

// nowhere is a node selector no node matches: a pod that carries it stays unscheduled, so that
// its deletion needs no kubelet.
var nowhere = map[string]string{corev1.LabelHostname: "no-such-node"}

// Deleting an object deletes what names it as its owner: the garbage collector runs.
func TestGarbageCollectorDeletesWhatAnOwnerOwned(t *testing.T) {
	cp := cluster.Get(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()

	owner, err := cp.Client.CoreV1().ConfigMaps("kubetest").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "owner"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	owned := pod("owned", "100m", "16Mi")
	owned.Spec.NodeSelector = nowhere
	owned.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}}
	_, err = cp.Client.CoreV1().Pods("kubetest").Create(ctx, owned, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cp.WaitPod(ctx, "kubetest", "owned", kubetest.Unschedulable)
	require.NoError(t, err)

	require.NoError(t, cp.Client.CoreV1().ConfigMaps("kubetest").Delete(ctx, owner.Name, metav1.DeleteOptions{}))
	_, err = cp.WaitPod(ctx, "kubetest", "owned", func(*corev1.Pod) bool { return false })
	assert.ErrorIs(t, err, kubetest.ErrPodDeleted, "the owner's deletion deletes the pod")
}

// A Job gets its pod from the job controller.
func TestJobControllerMakesAJobsPod(t *testing.T) {
	cp := cluster.Get(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()

	tmpl := pod("", "100m", "16Mi")
	tmpl.Spec.NodeSelector = nowhere
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	job, err := cp.Client.BatchV1().Jobs("kubetest").Create(ctx, &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "made-by-controller"},
		Spec:       batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: tmpl.Spec}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	sel := labels.Set{batchv1.JobNameLabel: job.Name}.String()
	w, err := cp.Client.CoreV1().Pods("kubetest").Watch(ctx, metav1.ListOptions{LabelSelector: sel})
	require.NoError(t, err)
	defer w.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			require.True(t, ok, "the watch ended before the job's pod came")
			if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type == watch.Added {
				require.Len(t, p.OwnerReferences, 1)
				assert.Equal(t, job.UID, p.OwnerReferences[0].UID, "the pod is the job's")
				// The Job's deletion takes its pod with it (the garbage collector).
				bg := metav1.DeletePropagationBackground
				require.NoError(t, cp.Client.BatchV1().Jobs("kubetest").Delete(ctx, job.Name, metav1.DeleteOptions{PropagationPolicy: &bg}))
				_, err := cp.WaitPod(ctx, "kubetest", p.Name, func(*corev1.Pod) bool { return false })
				assert.ErrorIs(t, err, kubetest.ErrPodDeleted)
				return
			}
		case <-ctx.Done():
			t.Fatalf("no pod for the job: %v", ctx.Err())
		}
	}
}
