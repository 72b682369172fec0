package k8s_test

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/elasticps/elasticps/internal/kubetest"
)

// awaitListed lists the objects of opts until one meets cond, and returns it: it lists, then
// watches from the list's version for one that meets cond, and lists again when the watch ends
// (the apiserver closes watches now and then).
func awaitListed[T any](ctx context.Context, opts metav1.ListOptions,
	list func(context.Context, metav1.ListOptions) ([]T, string, error),
	watchFrom func(context.Context, metav1.ListOptions) (watch.Interface, error),
	cond func(*T) bool) (*T, error) {
	for {
		items, version, err := list(ctx, opts)
		if err != nil {
			return nil, err
		}
		for i := range items {
			if cond(&items[i]) {
				return &items[i], nil
			}
		}
		from := opts
		from.ResourceVersion = version
		w, err := watchFrom(ctx, from)
		if err != nil {
			return nil, err
		}
		for ev := range w.ResultChan() {
			if o, ok := any(ev.Object).(*T); ok && ev.Type != watch.Deleted && cond(o) {
				w.Stop()
				return o, nil
			}
		}
		w.Stop()
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

// awaitPod watches the namespace's pods of selector until one meets cond, and returns it.
func awaitPod(ctx context.Context, cp *kubetest.ControlPlane, ns, selector string, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	pods := cp.Client.CoreV1().Pods(ns)
	return awaitListed(ctx, metav1.ListOptions{LabelSelector: selector},
		func(ctx context.Context, o metav1.ListOptions) ([]corev1.Pod, string, error) {
			l, err := pods.List(ctx, o)
			if err != nil {
				return nil, "", err
			}
			return l.Items, l.ResourceVersion, nil
		}, pods.Watch, cond)
}

// awaitLease watches Lease ns/name until cond holds of it, and returns it.
func awaitLease(ctx context.Context, cp *kubetest.ControlPlane, ns, name string, cond func(*coordinationv1.Lease) bool) (*coordinationv1.Lease, error) {
	leases := cp.Client.CoordinationV1().Leases(ns)
	return awaitListed(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector(metav1.ObjectNameField, name).String()},
		func(ctx context.Context, o metav1.ListOptions) ([]coordinationv1.Lease, string, error) {
			l, err := leases.List(ctx, o)
			if err != nil {
				return nil, "", err
			}
			return l.Items, l.ResourceVersion, nil
		}, leases.Watch, cond)
}
