package kube_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/internal/kubetest"
	"github.com/elasticps/elasticps/ps"
)

// cluster is the control plane the tests share; each test has a namespace and a node of its own.
var cluster kubetest.Fixture

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.Stop()
	os.Exit(code)
}

// secret is the cluster secret the remote servers of the tests are made with; they are never called.
var secret = []byte("a secret of the kube scaler tests")

// testTimeout bounds each test's waits.
const testTimeout = time.Minute

var envs atomic.Int32

// env is a test's part of the cluster: a namespace and a node, with a kubelet stand-in.
type env struct {
	t       *testing.T
	cp      *kubetest.ControlPlane
	ns      string
	node    string
	kubelet *kubelet
	ctx     context.Context
}

// newEnv makes a namespace and a node of capacity (default 64 CPUs, 256Gi) for t.
func newEnv(t *testing.T, capacity corev1.ResourceList) *env {
	t.Helper()
	cp := cluster.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	n := envs.Add(1)
	e := &env{t: t, cp: cp, ns: fmt.Sprintf("kube-%d", n), node: fmt.Sprintf("node-%d", n), ctx: ctx}
	require.NoError(t, cp.CreateNamespace(ctx, e.ns))
	if capacity == nil {
		capacity = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi")}
	}
	require.NoError(t, cp.AddNode(ctx, e.node, capacity))
	e.kubelet = startKubelet(t, cp.Client, e.ns, e.node)
	return e
}

// config returns a scaler config for job, its pods pinned to the env's node.
func (e *env) config(job string) kube.Config {
	return kube.Config{
		Client:    e.cp.Client,
		Namespace: e.ns,
		Job:       job,
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			NodeSelector: map[string]string{corev1.LabelHostname: e.node},
			Containers: []corev1.Container{{Name: "main", Image: "example.invalid/elasticps:test",
				Command: []string{"/elasticps"}, Args: []string{"-v"}}},
		}},
		Args: func(l kube.Launch) []string {
			return []string{"-role=" + l.Role.String(), "-id=" + l.ID, fmt.Sprintf("-restart=%d", l.Restart)}
		},
		Secret:    corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "elasticps"}, Key: "secret"},
		StopGrace: 5 * time.Second,
		Server: func(id, addr string) (elastic.ParameterServer, error) {
			srv, err := remote.NewServer(ps.Node{ID: id, Addr: addr}, remote.Config{Secret: secret})
			if err == nil {
				e.t.Cleanup(func() { srv.Close() })
			}
			return srv, err
		},
	}
}

// scaler makes a scaler of cfg that records its events, closed when the test ends.
func (e *env) scaler(cfg kube.Config) (*kube.Scaler, *recorder) {
	e.t.Helper()
	rec := &recorder{changed: make(chan struct{})}
	cfg.OnEvent = rec.on
	s, err := kube.New(e.ctx, cfg)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { s.Close() })
	return s, rec
}

// recorder keeps a scaler's events.
type recorder struct {
	mu      sync.Mutex
	events  []kube.Event
	changed chan struct{} // closed and replaced at every event
}

func (r *recorder) on(ev kube.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) changes() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// of returns the events of node id.
func (r *recorder) of(id string) []kube.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []kube.Event
	for _, ev := range r.events {
		if ev.ID == id {
			out = append(out, ev)
		}
	}
	return out
}

// await waits until node id has an event of kind, and returns the first.
func (r *recorder) await(ctx context.Context, id string, kind kube.EventKind) (kube.Event, error) {
	for {
		ch := r.changes()
		if i := slices.IndexFunc(r.of(id), func(ev kube.Event) bool { return ev.Kind == kind }); i >= 0 {
			return r.of(id)[i], nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return kube.Event{}, fmt.Errorf("no %s event of %s (events: %v): %w", kind, id, r.of(id), ctx.Err())
		}
	}
}

// procs returns what runs: the node ids of the scaler's running pods, with their uids.
func procs(s *kube.Scaler) func() elastictest.Procs {
	return func() elastictest.Procs {
		out := elastictest.Procs{}
		for _, p := range s.Pods() {
			if p.Running {
				out[p.ID] = string(p.UID)
			}
		}
		return out
	}
}

// pod returns pod id of job, failing the test if it is not there.
func (e *env) pod(job, id string) *corev1.Pod {
	e.t.Helper()
	p, err := e.cp.Client.CoreV1().Pods(e.ns).Get(e.ctx, kube.PodName(job, id), metav1.GetOptions{})
	require.NoError(e.t, err)
	return p
}

// reporter records what a Reporter is told.
type reporter struct {
	mu    sync.Mutex
	calls []string // "server ps-0: reason", "worker worker-1: reason"
}

func (r *reporter) ServerFailed(id, reason string) { r.add("server " + id + ": " + reason) }
func (r *reporter) Fail(worker, reason string)     { r.add("worker " + worker + ": " + reason) }

func (r *reporter) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, s)
}

func (r *reporter) told() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}
