package kubetest

import (
	"context"
	"fmt"
	"runtime"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// defaultPods is the pod capacity AddNode gives a node whose capacity names none, the kubelet's
// default. A node with no pod capacity fits no pod.
const defaultPods = 110

// AddNode registers a Node as a kubelet would, ready and schedulable, with capacity as both its
// capacity and its allocatable resources (plus 110 pods unless capacity says). It carries the
// label kubernetes.io/hostname=name, for a pod's nodeSelector.
//
// The apiserver taints every new Node node.kubernetes.io/not-ready until the controller manager
// sees it ready; with no controller manager AddNode removes the taint itself. Nothing here
// watches node heartbeats either (that is also the controller manager), so the Node stays Ready
// with no Lease to renew; a test that wants a node gone deletes it.
func (cp *ControlPlane) AddNode(ctx context.Context, name string, capacity corev1.ResourceList) error {
	capacity = capacity.DeepCopy()
	if _, ok := capacity[corev1.ResourcePods]; !ok {
		capacity[corev1.ResourcePods] = *resource.NewQuantity(defaultPods, resource.DecimalSI)
	}
	now := metav1.Now()
	condition := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				corev1.LabelHostname:   name,
				corev1.LabelOSStable:   "linux",
				corev1.LabelArchStable: runtime.GOARCH,
			},
		},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
			Conditions: []corev1.NodeCondition{
				condition(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady"),
				condition(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory"),
				condition(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure"),
				condition(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID"),
			},
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
				{Type: corev1.NodeHostName, Address: name},
			},
			Phase: corev1.NodeRunning,
		},
	}
	nodes := cp.Client.CoreV1().Nodes()
	created, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("kubetest: create node %s: %w", name, err)
	}
	// A create keeps the status a kubelet sends with it; should that rule change, the status
	// goes in a second write rather than leaving a node that fits no pod.
	if len(created.Status.Allocatable) == 0 {
		created.Status = node.Status
		if _, err := nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("kubetest: node %s status: %w", name, err)
		}
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		taints := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t corev1.Taint) bool {
			return t.Key == corev1.TaintNodeNotReady
		})
		if len(taints) == len(n.Spec.Taints) {
			return nil
		}
		n.Spec.Taints = taints
		_, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("kubetest: untaint node %s: %w", name, err)
	}
	return nil
}
