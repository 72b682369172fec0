package kubetest_test

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elasticps/elasticps/internal/kubetest"
)

// A test starts its own control plane, adds a node and waits for the scheduler to place a pod.
// (Not run as an example: it needs a *testing.T and the built binaries.)
func ExampleStart() {
	_ = func(t *testing.T) {
		cp := kubetest.Start(t, kubetest.Options{Namespaces: []string{"train"}})
		ctx := t.Context()
		if err := cp.AddNode(ctx, "node-1", resources("4", "8Gi")); err != nil {
			t.Fatal(err)
		}
		p := pod("worker-0", "1", "1Gi")
		p.Namespace = "train"
		if _, err := cp.Client.CoreV1().Pods("train").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := cp.WaitPod(ctx, "train", "worker-0", kubetest.Scheduled)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println(got.Spec.NodeName)
	}
}

// A test runs a node agent, which runs the pods bound to its node as local processes: here a
// pod of an image that is /bin/echo. (Not run as an example: it needs a *testing.T, root and
// the built binaries.)
func ExampleControlPlane_StartNode() {
	_ = func(t *testing.T) {
		cp := kubetest.Start(t, kubetest.Options{Namespaces: []string{"train"}})
		ctx := t.Context()
		node := cp.StartNode(t, "node-1", kubetest.NodeOptions{
			Capacity: resources("4", "8Gi"),
			Images:   map[string]string{"example/echo": "/bin/echo"},
		})
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "train"},
			Spec: corev1.PodSpec{
				NodeSelector:  map[string]string{corev1.LabelHostname: "node-1"},
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name:  "main",
					Image: "example/echo",
					Args:  []string{"hello from", "$(POD_IP)"},
					Env: []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{
						FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"},
					}}},
				}},
			},
		}
		if _, err := cp.Client.CoreV1().Pods("train").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := cp.WaitPod(ctx, "train", "hello", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
		if err != nil {
			t.Fatal(err)
		}
		fmt.Print(got.Status.PodIP == kubetest.PodIP("train", "hello"), " ", node.Logs("train", "hello"))
	}
}

// The scheduler's verdict on a pod that fits no node is in its PodScheduled condition.
func ExampleUnschedulable() {
	pod := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{
		Type:    corev1.PodScheduled,
		Status:  corev1.ConditionFalse,
		Reason:  corev1.PodReasonUnschedulable,
		Message: "0/1 nodes are available: 1 Insufficient memory.",
	}}}}
	fmt.Println(kubetest.Scheduled(pod), kubetest.Unschedulable(pod))
	fmt.Println(kubetest.PodScheduledCondition(pod).Message)
	// Output:
	// false true
	// 0/1 nodes are available: 1 Insufficient memory.
}
