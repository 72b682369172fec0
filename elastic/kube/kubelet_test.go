package kube_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// kubelet stands in for the kubelet of one node: it writes the status a kubelet would for the
// pods bound to the node (their containers run at once), and finishes a deletion as a kubelet
// does once the program has left (its containers terminated with status 0, then the pod deleted
// with no grace, under a UID precondition). A test ends a pod as a crash, an OOM kill or an
// eviction with end, and holds deletions with hold.
type kubelet struct {
	client kubernetes.Interface

	mu      sync.Mutex
	holding bool
	held    []*corev1.Pod
}

// How end ends a pod.
const (
	crash    = "Error"
	oomKill  = "OOMKilled"
	eviction = "Evicted"
	done     = "Completed" // an exit with status 0
)

func startKubelet(t *testing.T, client kubernetes.Interface, namespace, node string) *kubelet {
	k := &kubelet{client: client}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	inf := f.Core().V1().Pods().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { k.sync(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { k.sync(obj.(*corev1.Pod)) },
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	return k
}

func (k *kubelet) sync(p *corev1.Pod) {
	ctx := context.Background()
	switch {
	case p.DeletionTimestamp != nil:
		k.mu.Lock()
		if k.holding {
			k.held = append(k.held, p)
			k.mu.Unlock()
			return
		}
		k.mu.Unlock()
		k.finish(ctx, p)
	case p.Status.Phase == "" || p.Status.Phase == corev1.PodPending:
		k.update(ctx, p, func(st *corev1.PodStatus) {
			now := metav1.Now()
			st.Phase, st.HostIP, st.PodIP, st.StartTime = corev1.PodRunning, "127.0.0.1", "127.0.0.1", &now
			st.HostIPs, st.PodIPs = []corev1.HostIP{{IP: "127.0.0.1"}}, []corev1.PodIP{{IP: "127.0.0.1"}}
			st.ContainerStatuses = nil
			for _, c := range p.Spec.Containers {
				st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, Image: c.Image,
					Ready: true, Started: new(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}})
			}
		})
	}
}

// finish terminates p's containers with status 0 and deletes it at once.
func (k *kubelet) finish(ctx context.Context, p *corev1.Pod) {
	if p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
		k.update(ctx, p, func(st *corev1.PodStatus) { terminate(st, corev1.PodSucceeded, 0, "Completed") })
	}
	zero := int64(0)
	k.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
}

// hold makes deletions wait; release finishes those held and lets the next ones through.
func (k *kubelet) hold() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.holding = true
}

func (k *kubelet) release() {
	k.mu.Lock()
	held := k.held
	k.holding, k.held = false, nil
	k.mu.Unlock()
	for _, p := range held {
		k.finish(context.Background(), p)
	}
}

// end ends pod namespace/name as how says: a crash (exit code 137), an OOM kill (137, reason
// OOMKilled), an eviction (the pod's status reason Evicted) or an exit with status 0.
func (k *kubelet) end(ctx context.Context, namespace, name, how string) error {
	p, err := k.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	return k.update(ctx, p, func(st *corev1.PodStatus) {
		if how == done {
			terminate(st, corev1.PodSucceeded, 0, how)
			return
		}
		terminate(st, corev1.PodFailed, 137, how)
		if how == eviction {
			st.Reason, st.Message = eviction, "The node was low on resource: memory."
			st.ContainerStatuses[0].State.Terminated.Reason = crash
		}
	})
}

func terminate(st *corev1.PodStatus, phase corev1.PodPhase, code int32, reason string) {
	now := metav1.Now()
	st.Phase = phase
	for i := range st.ContainerStatuses {
		cs := &st.ContainerStatuses[i]
		started := now
		if cs.State.Running != nil {
			started = cs.State.Running.StartedAt
		}
		cs.Ready, cs.Started = false, new(false)
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, StartedAt: started, FinishedAt: now}}
	}
}

// update changes p's status with change, again on a conflict with a fresh copy.
func (k *kubelet) update(ctx context.Context, p *corev1.Pod, change func(*corev1.PodStatus)) error {
	pods := k.client.CoreV1().Pods(p.Namespace)
	p = p.DeepCopy()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		change(&p.Status)
		_, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
		if err != nil {
			if fresh, gerr := pods.Get(ctx, p.Name, metav1.GetOptions{}); gerr == nil && fresh.UID == p.UID {
				p = fresh
			}
		}
		return err
	})
}
