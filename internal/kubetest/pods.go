package kubetest

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// ErrPodDeleted is returned by WaitPod when the pod is deleted before it meets the condition.
var ErrPodDeleted = errors.New("kubetest: pod deleted")

// WaitPod watches pod namespace/name until cond holds for it, and returns the pod as it was
// then. It returns ctx's error if ctx ends first (with the pod's last state in the message),
// ErrPodDeleted if the pod is deleted, and an error if the control plane stops. A pod that does
// not exist yet is waited for.
func (cp *ControlPlane) WaitPod(ctx context.Context, namespace, name string, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	pods := cp.Client.CoreV1().Pods(namespace)
	sel := fields.OneTermEqualSelector(metav1.ObjectNameField, name).String()
	var last *corev1.Pod
	for {
		list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return nil, cp.waitErr(ctx, namespace, name, last, err)
		}
		if len(list.Items) == 1 {
			last = &list.Items[0]
			if cond(last) {
				return last, nil
			}
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return nil, cp.waitErr(ctx, namespace, name, last, err)
		}
		pod, err := cp.watchPod(ctx, w, cond, &last)
		w.Stop()
		if pod != nil || err != nil {
			if err != nil {
				err = cp.waitErr(ctx, namespace, name, last, err)
			}
			return pod, err
		}
		// The watch ended (the apiserver closes them now and then): list and watch again.
	}
}

// watchPod reads w until cond holds for a pod (returned), the pod is deleted or ctx ends
// (error), or w ends (nil, nil). *last is kept as the pod's latest state.
func (cp *ControlPlane) watchPod(ctx context.Context, w watch.Interface, cond func(*corev1.Pod) bool, last **corev1.Pod) (*corev1.Pod, error) {
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-cp.stopped:
			return nil, errStopped
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, nil
			}
			switch ev.Type {
			case watch.Deleted:
				return nil, ErrPodDeleted
			case watch.Error:
				return nil, nil // most often a resource version too old: list again
			}
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			*last = pod
			if cond(pod) {
				return pod, nil
			}
		}
	}
}

// waitErr wraps err from WaitPod with the pod's last state, for a failure that says why.
func (cp *ControlPlane) waitErr(ctx context.Context, namespace, name string, last *corev1.Pod, err error) error {
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	state := "never seen"
	if last != nil {
		state = fmt.Sprintf("phase %s, node %q, conditions %v", last.Status.Phase, last.Spec.NodeName, last.Status.Conditions)
	}
	return fmt.Errorf("kubetest: wait for pod %s/%s (%s): %w", namespace, name, state, err)
}

// Scheduled reports whether the scheduler has bound pod to a node, for WaitPod.
func Scheduled(pod *corev1.Pod) bool { return pod.Spec.NodeName != "" }

// Unschedulable reports whether the scheduler has tried pod and found no node for it, for
// WaitPod; the PodScheduled condition's message then says why ("0/1 nodes are available: 1
// Insufficient memory").
func Unschedulable(pod *corev1.Pod) bool {
	c := PodScheduledCondition(pod)
	return c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
}

// PodScheduledCondition returns pod's PodScheduled condition, or nil if it has none yet.
func PodScheduledCondition(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodScheduled {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}
