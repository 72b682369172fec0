package kube_test

import (
	"bytes"
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/internal/wait"
)

// rbacFile is the example RBAC of a coordinator.
const rbacFile = "../../examples/k8s/rbac.yaml"

// The example RBAC grants what the scaler and Lead need, and no less: a Role without the
// deletion of pods makes StopServers fail with the apiserver's refusal.
func TestRBACExample(t *testing.T) {
	e := newEnv(t, nil)
	sa, role, binding := readRBAC(t)
	client := e.apply(sa, role, binding)

	cfg := e.config("rbac")
	cfg.Client = client
	s, _ := e.scaler(cfg)
	require.NoError(t, s.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 2}))
	added, err := s.StartServers(e.ctx, 1)
	require.NoError(t, err)
	require.Len(t, added, 1)
	require.NoError(t, s.StopServers(e.ctx, []string{"ps-1"}))
	require.NoError(t, s.Scale(e.ctx, elastic.Plan{Servers: 1, Workers: 1}))
	require.NoError(t, s.Close())
	list, err := e.cp.Client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, list.Items)

	ctx, cancel := context.WithCancel(e.ctx)
	led := make(chan struct{})
	err = kube.Lead(ctx, kube.LeaderConfig{Client: client, Namespace: e.ns, Name: "rbac", Identity: "coordinator-0"},
		func(ctx context.Context) { close(led); cancel(); <-ctx.Done() })
	assert.NoError(t, err)
	select {
	case <-led:
	default:
		t.Error("Lead never ran")
	}

	// The same Role without "delete" on pods.
	cfg.Client = e.apply(withoutDelete(sa, role, binding))
	cfg.Job = "nodelete"
	s, _ = e.scaler(cfg)
	require.NoError(t, s.Scale(e.ctx, elastic.Plan{Servers: 1}))
	_, err = s.StartServers(e.ctx, 1)
	require.NoError(t, err)
	err = s.StopServers(e.ctx, []string{"ps-1"})
	require.Error(t, err)
	assert.True(t, apierrors.IsForbidden(err), "forbidden: %v", err)
	assert.Contains(t, err.Error(), `cannot delete resource "pods"`)
	assert.Equal(t, 2, s.Plan().Servers, "the server the scaler could not stop stays in the plan")
	assert.True(t, podStatus(s, "ps-1").Running)
	err = s.Close()
	assert.True(t, apierrors.IsForbidden(err), "Close reports the pods it could not delete: %v", err)
	for _, id := range []string{"ps-0", "ps-1"} {
		require.NoError(t, e.cp.Client.CoreV1().Pods(e.ns).Delete(e.ctx, kube.PodName("nodelete", id), metav1.DeleteOptions{}))
	}
}

// withoutDelete returns the example's account, Role and binding under another name, and without
// the deletion of pods.
func withoutDelete(sa *corev1.ServiceAccount, role *rbacv1.Role, binding *rbacv1.RoleBinding) (*corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding) {
	sa, role, binding = sa.DeepCopy(), role.DeepCopy(), binding.DeepCopy()
	sa.Name, role.Name, binding.Name = "elasticps-nodelete", "elasticps-nodelete", "elasticps-nodelete"
	binding.RoleRef.Name, binding.Subjects[0].Name = role.Name, sa.Name
	for i, r := range role.Rules {
		if slices.Contains(r.Resources, "pods") {
			role.Rules[i].Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == "delete" })
		}
	}
	return sa, role, binding
}

// readRBAC decodes the example file.
func readRBAC(t *testing.T) (*corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding) {
	t.Helper()
	data, err := os.ReadFile(rbacFile)
	require.NoError(t, err)
	var (
		sa      *corev1.ServiceAccount
		role    *rbacv1.Role
		binding *rbacv1.RoleBinding
	)
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		require.NoError(t, err)
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			sa = o
		case *rbacv1.Role:
			role = o
		case *rbacv1.RoleBinding:
			binding = o
		default:
			t.Fatalf("unexpected %T in %s", obj, rbacFile)
		}
	}
	require.NotNil(t, sa)
	require.NotNil(t, role)
	require.NotNil(t, binding)
	return sa, role, binding
}

// apply creates the account, its Role and binding in the env's namespace, and returns a client
// that acts as the account once the authorizer knows the binding.
func (e *env) apply(sa *corev1.ServiceAccount, role *rbacv1.Role, binding *rbacv1.RoleBinding) kubernetes.Interface {
	e.t.Helper()
	admin := e.cp.Client
	_, err := admin.CoreV1().ServiceAccounts(e.ns).Create(e.ctx, sa, metav1.CreateOptions{})
	require.NoError(e.t, err)
	_, err = admin.RbacV1().Roles(e.ns).Create(e.ctx, role, metav1.CreateOptions{})
	require.NoError(e.t, err)
	_, err = admin.RbacV1().RoleBindings(e.ns).Create(e.ctx, binding, metav1.CreateOptions{})
	require.NoError(e.t, err)
	token, err := e.cp.TokenFor(e.ctx, sa.Name, e.ns)
	require.NoError(e.t, err)
	client, err := kubernetes.NewForConfig(e.cp.ConfigFor(token))
	require.NoError(e.t, err)
	// The authorizer reads bindings from a cache that follows the writes, and says nothing when
	// it has caught up: ask until it allows what the Role grants.
	for {
		_, err = client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{Limit: 1})
		if !apierrors.IsForbidden(err) {
			break
		}
		require.NoError(e.t, wait.Sleep(e.ctx, 20*time.Millisecond), "the Role never took effect: %v", err)
	}
	require.NoError(e.t, err)
	return client
}
