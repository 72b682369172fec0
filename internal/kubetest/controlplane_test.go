package kubetest_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/elasticps/elasticps/internal/kubetest"
	"github.com/elasticps/elasticps/internal/wait"
)

// cluster is the control plane the tests share: one start per test binary. It runs the
// controllers a job's owner references, a coordinator's Job and a checkpoint directory's
// PersistentVolumeClaim need. The binder looks again at a claim that found no volume every
// second, not every 15 s, so that a test that binds one late need not wait.
var cluster = kubetest.Fixture{Options: kubetest.Options{
	Namespaces:      []string{"kubetest"},
	Controllers:     []string{"garbage-collector-controller", "job-controller", "persistentvolume-binder-controller"},
	ControllerFlags: []string{"--pvclaimbinder-sync-period=1s"},
}}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == helperArg {
		os.Exit(runHelper(os.Args[2:])) // a pod's program: see agent_helpers_test.go
	}
	code := m.Run()
	cluster.Stop()
	os.Exit(code)
}

// testTimeout bounds each test's waits on the control plane; an idle machine needs about a second.
const testTimeout = time.Minute

// pod returns a pod in namespace kubetest that requests cpu and memory. No kubelet runs it:
// its image is never pulled.
func pod(name, cpu, memory string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kubetest"},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "main",
				Image: "example.invalid/none",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU:    resource.MustParse(cpu),
					corev1.ResourceMemory: resource.MustParse(memory),
				}},
			}},
		},
	}
}

func resources(cpu, memory string) corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse(cpu),
		corev1.ResourceMemory: resource.MustParse(memory),
	}
}

func TestSchedulerBindsAPodToANodeThatFits(t *testing.T) {
	cp := cluster.Get(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	require.NoError(t, cp.AddNode(ctx, "fits", resources("4", "8Gi")))

	// Pinned to its node by hostname, so another test's node cannot take it.
	p := pod("bound", "1", "1Gi")
	p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "fits"}
	_, err := cp.Client.CoreV1().Pods("kubetest").Create(ctx, p, metav1.CreateOptions{})
	require.NoError(t, err)

	got, err := cp.WaitPod(ctx, "kubetest", "bound", kubetest.Scheduled)
	require.NoError(t, err)
	assert.Equal(t, "fits", got.Spec.NodeName)
	c := kubetest.PodScheduledCondition(got)
	if assert.NotNil(t, c, "the scheduler sets PodScheduled") {
		assert.Equal(t, corev1.ConditionTrue, c.Status)
	}
}

func TestSchedulerSaysWhyAPodDoesNotFit(t *testing.T) {
	cp := cluster.Get(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	require.NoError(t, cp.AddNode(ctx, "small", resources("2", "2Gi")))

	_, err := cp.Client.CoreV1().Pods("kubetest").Create(ctx, pod("too-big", "1", "1Ti"), metav1.CreateOptions{})
	require.NoError(t, err)

	got, err := cp.WaitPod(ctx, "kubetest", "too-big", kubetest.Unschedulable)
	require.NoError(t, err)
	assert.Empty(t, got.Spec.NodeName)
	assert.Equal(t, corev1.PodPending, got.Status.Phase)
	assert.Contains(t, kubetest.PodScheduledCondition(got).Message, "Insufficient memory")
}

func TestServiceAccountGetsOnlyWhatItsRoleAllows(t *testing.T) {
	cp := cluster.Get(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()
	const ns = "kubetest-rbac"
	require.NoError(t, cp.CreateNamespace(ctx, ns))

	_, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "reader"},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	bindPodReader(t, ctx, cp, ns, "reader", "get", "list", "watch")

	token, err := cp.TokenFor(ctx, "reader", ns)
	require.NoError(t, err)
	reader, err := kubernetes.NewForConfig(cp.ConfigFor(token))
	require.NoError(t, err)

	// The authorizer reads Roles from a cache that follows the writes: wait until it has the
	// binding, so that the refusal below is the Role's and not a cache's lag.
	for {
		_, err = reader.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			break
		}
		require.NoError(t, wait.Sleep(ctx, 20*time.Millisecond), "the Role never allowed a list: %v", err)
	}
	require.NoError(t, err, "the Role allows list")

	p := pod("not-allowed", "1", "1Gi")
	p.Namespace = ns
	_, err = reader.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "create is not in the Role: got %v", err)
	_, err = reader.CoreV1().Pods("kubetest").List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "a Role grants nothing outside its namespace: got %v", err)
}

func TestKubeconfigAndStaticTokens(t *testing.T) {
	cp := cluster.Get(t)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()

	path := t.TempDir() + "/kubeconfig"
	require.NoError(t, cp.WriteKubeconfig(path, ""))
	fromFile, err := clientFromKubeconfig(path)
	require.NoError(t, err)
	v, err := fromFile.Discovery().ServerVersion()
	require.NoError(t, err)
	assert.Equal(t, "1", v.Major, "the binaries report their release, %s", v.GitVersion)

	_, err = cp.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	assert.NoError(t, err, "the administrator lists nodes")
	stranger, err := kubernetes.NewForConfig(cp.ConfigFor("not-a-token"))
	require.NoError(t, err)
	_, err = stranger.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	assert.True(t, apierrors.IsUnauthorized(err), "an unknown token is refused: got %v", err)
}

// bindPodReader gives ServiceAccount sa of namespace ns a Role ("pod-reader") with verbs on the
// namespace's pods.
func bindPodReader(t *testing.T, ctx context.Context, cp *kubetest.ControlPlane, ns, sa string, verbs ...string) {
	t.Helper()
	_, err := cp.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: verbs}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cp.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reader-reads-pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

func clientFromKubeconfig(path string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
