package k8s_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/internal/kubetest"
)

// image is the image the manifests name: the node agents run the dlrm binary for it.
const image = "elasticps/dlrm:dev"

// jobTimeout bounds a job's run on the local control plane.
const jobTimeout = 2 * time.Minute

// smallData are the flags that make the manifests' job small enough for a test: the rest of
// its command line is the manifest's.
var smallData = map[string]string{
	"-train-records": "6000", "-test-records": "1000", "-batch": "100", "-dim": "4",
	"-bottom": "8", "-top": "8", "-checkpoint-every": "10", "-epochs": "2",
}

// deploy applies the manifests to namespace ns as a user would after making the Secret with a
// random value (the manifests' placeholder is refused), the job shrunk by smallData, with the
// checkpoint claim bound to a directory of this machine. It returns the Job's name.
func deploy(t *testing.T, ctx context.Context, cp *kubetest.ControlPlane, ns string, flags map[string]string) (job string, secret []byte) {
	t.Helper()
	require.NoError(t, cp.CreateNamespace(ctx, ns))
	a := newApplier(t, cp, ns)
	ms := readManifests(t)
	// The Job last: its controller makes the coordinator's pod at once, which needs the
	// ServiceAccount, the Secret and the claim (kubectl apply -f of the directory may need a
	// second run for the same reason).
	slices.SortStableFunc(ms, func(a, b manifest) int { return cmp.Compare(kindOrder(a), kindOrder(b)) })
	for _, m := range ms {
		obj := m.obj
		switch obj.GetKind() {
		case "Secret":
			key := make([]byte, 32)
			_, _ = rand.Read(key)
			secret = []byte(base64.StdEncoding.EncodeToString(key))
			require.NoError(t, unstructured.SetNestedField(obj.Object, string(secret), "stringData", "secret"))
		case "PersistentVolumeClaim":
			_, err := cp.CreateHostPathVolume(ctx, kubetest.HostPathVolume{Name: ns + "-checkpoints", Path: t.TempDir(),
				Claim: types.NamespacedName{Namespace: ns, Name: obj.GetName()}})
			require.NoError(t, err)
		case "Job":
			job = obj.GetName()
			containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
			c := containers[0].(map[string]any)
			var args []any
			set := maps.Clone(smallData)
			maps.Copy(set, flags)
			for _, a := range c["args"].([]any) {
				name, _, _ := strings.Cut(a.(string), "=")
				if _, replaced := set[name]; !replaced {
					args = append(args, a)
				}
			}
			for _, name := range slices.Sorted(maps.Keys(set)) {
				args = append(args, name+"="+set[name])
			}
			c["args"] = args
			require.NoError(t, unstructured.SetNestedSlice(obj.Object, containers, "spec", "template", "spec", "containers"))
		}
		require.NoError(t, a.apply(ctx, obj), m.String())
	}
	require.NotEmpty(t, job)
	return job, secret
}

// kindOrder puts a Job after everything else.
func kindOrder(m manifest) int {
	if m.obj.GetKind() == "Job" {
		return 1
	}
	return 0
}

// waitJob waits until the Job has succeeded or failed, and returns it.
func waitJob(ctx context.Context, cp *kubetest.ControlPlane, ns, name string) (*batchv1.Job, error) {
	jobs := cp.Client.BatchV1().Jobs(ns)
	for {
		j, err := jobs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if j.Status.Succeeded > 0 || j.Status.Failed > 0 {
			return j, nil
		}
		w, err := jobs.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: j.ResourceVersion})
		if err != nil {
			return nil, err
		}
		for ev := range w.ResultChan() {
			if j, ok := ev.Object.(*batchv1.Job); ok && ev.Type == watch.Modified && (j.Status.Succeeded > 0 || j.Status.Failed > 0) {
				w.Stop()
				return j, nil
			}
		}
		w.Stop()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("job %s/%s: %w", ns, name, err)
		}
	}
}

// podLogs returns the output of every pod of the namespace the node ran, for a failure.
func podLogs(ctx context.Context, cp *kubetest.ControlPlane, node *kubetest.Node, ns string) string {
	pods, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "--- pod %s (%s, deleting %v):\n%s\n", p.Name, p.Status.Phase, p.DeletionTimestamp != nil, node.Logs(ns, p.Name))
	}
	return b.String()
}

// runs numbers the tests' jobs: each gets a namespace and a node of its own, also when a test
// runs again on the same control plane (go test -count).
var runs atomic.Int64

// start returns the test's control plane, a namespace and a node agent of its own, named after
// name, whose pods run the dlrm binary for the manifests' image, and a context bounded by
// jobTimeout.
func start(t *testing.T, name string) (*kubetest.ControlPlane, *kubetest.Node, context.Context, string) {
	t.Helper()
	name = fmt.Sprintf("%s-%d", name, runs.Add(1))
	cp := cluster.Get(t)
	bin := dlrmBinary(t)
	ctx, cancel := context.WithTimeout(t.Context(), jobTimeout)
	t.Cleanup(cancel)
	node := cp.StartNode(t, name, kubetest.NodeOptions{
		Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("32Gi")},
		Images:   map[string]string{image: bin},
	})
	return cp, node, ctx, name
}

// The job of the example manifests trains to its end on Kubernetes: the Job runs the
// coordinator, which holds the Lease, starts two servers and two workers as pods and
// checkpoints to the claim; every position is trained exactly once; at the end the job's pods
// are gone, and deleting the Job deletes the Service the coordinator made.
func TestJobOfTheManifestsTrainsToItsEnd(t *testing.T) {
	cp, node, ctx, ns := start(t, "train")
	job, _ := deploy(t, ctx, cp, ns, nil)

	// The pods the job ran, as the watch saw them come.
	var ran []string
	pods, err := cp.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: kube.LabelJob + "=" + job})
	require.NoError(t, err)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range pods.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				ran = append(ran, p.Name)
			}
		}
	}()
	done, err := waitJob(ctx, cp, ns, job)
	pods.Stop()
	<-watched
	require.NoError(t, err, podLogs(context.WithoutCancel(ctx), cp, node, ns))
	require.Equal(t, int32(1), done.Status.Succeeded, "the Job succeeded\n%s", podLogs(ctx, cp, node, ns))

	list, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
	require.NoError(t, err)
	require.Len(t, list.Items, 1, "one coordinator pod")
	out := node.Logs(ns, list.Items[0].Name)
	assert.Contains(t, out, "every position of every epoch covered exactly once", out)
	assert.Contains(t, out, "every epoch done", out)

	left, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelRole + " in (ps,worker)"})
	require.NoError(t, err)
	assert.Empty(t, left.Items, "the coordinator deleted its servers and workers at the job's end")
	for _, id := range []string{"ps-0", "ps-1", "worker-0", "worker-1"} {
		assert.Contains(t, ran, kube.PodName(job, id), "the job ran %s as a pod", id)
	}

	_, err = cp.Client.CoreV1().Services(ns).Get(ctx, job, metav1.GetOptions{})
	require.NoError(t, err, "the coordinator made the job's Service")
	bg := metav1.DeletePropagationBackground
	require.NoError(t, cp.Client.BatchV1().Jobs(ns).Delete(ctx, job, metav1.DeleteOptions{PropagationPolicy: &bg}))
	require.NoError(t, waitGone(ctx, cp, ns, job), "the Job's deletion deletes the Service it owns")
}

// waitGone waits until Service ns/name is deleted.
func waitGone(ctx context.Context, cp *kubetest.ControlPlane, ns, name string) error {
	svcs := cp.Client.CoreV1().Services(ns)
	for {
		list, err := svcs.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
		if err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return nil
		}
		w, err := svcs.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return err
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				w.Stop()
				return nil
			}
		}
		w.Stop()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
