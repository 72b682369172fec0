package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
)

// callTimeout bounds a deletion that a caller's ctx does not.
const callTimeout = 30 * time.Second

// closeMargin is how long Close waits for the pods it deleted beyond their grace period, before
// it deletes what is left at once.
const closeMargin = 10 * time.Second

// Scaler is an elastic.ServerScaler that runs a job's parameter servers and workers as pods:
// one pod per node id, "<job>-<id>", watched through an informer, replaced under its name after
// an abnormal end up to Config.MaxRestarts (with more memory after an OOM kill), and deleted
// with a grace period when Scale, StopServers or Close stop it. See the package doc. It is safe
// for concurrent use; Close deletes its pods and joins every goroutine.
type Scaler struct {
	cfg       Config
	log       *slog.Logger
	container int    // the program's container in the template
	cname     string // its name
	pods      typedcorev1.PodInterface
	factory   informers.SharedInformerFactory
	indexer   cache.Indexer
	ctx       context.Context // the scaler's life: the node goroutines' calls; cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup // one per node goroutine
	closeOnce sync.Once
	closeErr  error

	// Lock order: serversMu, changeMu, mu.
	serversMu sync.Mutex // held through StartServers and StopServers: the server count changes one call at a time
	changeMu  sync.Mutex // held by a plan change until it is committed (its pods deleted, its nodes started)

	mu         sync.Mutex
	plan       elastic.Plan
	serversSet bool                   // the server count is set: by the first Scale, or StartServers
	nodes      map[string]*node       // the node ids of the plan
	last       map[string]*node       // the newest node of every node id ever run
	gone       map[string]*corev1.Pod // per pod name, the last state of the newest pod deleted
	changed    chan struct{}          // closed and replaced at every pod event and stop
	reporter   Reporter
	closed     bool
	oomKills   []autoscale.OOMKill // the servers' OOM kills not yet taken (OOMKills)
}

var _ elastic.ServerScaler = (*Scaler)(nil)

// New checks cfg, makes sure the job's headless Service exists (it creates it, or adopts one
// that carries the job's labels; another object of the name is an error wrapping ErrConflict),
// and starts watching the job's pods; it returns once the watch has listed them. ctx bounds
// New only. No pod is created until Scale.
func New(ctx context.Context, cfg Config) (*Scaler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Scaler{cfg: cfg, log: cfg.Logger.With("job", cfg.Job), pods: cfg.Client.CoreV1().Pods(cfg.Namespace),
		nodes: map[string]*node{}, last: map[string]*node{}, gone: map[string]*corev1.Pod{}, changed: make(chan struct{})}
	s.container, _ = cfg.container()
	s.cname = cfg.Template.Spec.Containers[s.container].Name
	if err := s.ensureService(ctx); err != nil {
		return nil, err
	}
	selector := LabelJob + "=" + cfg.Job
	// A list first, so that missing rights fail here with the apiserver's words rather than in
	// the informer's retries.
	if _, err := s.pods.List(ctx, metav1.ListOptions{LabelSelector: selector, Limit: 1}); err != nil {
		return nil, fmt.Errorf("kube: list the job's pods: %w", err)
	}
	s.factory = informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	inf := s.factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.observed(obj, false) },
		UpdateFunc: func(_, obj any) { s.observed(obj, false) },
		DeleteFunc: func(obj any) { s.observed(obj, true) },
	}); err != nil {
		return nil, fmt.Errorf("kube: watch the job's pods: %w", err)
	}
	s.indexer = inf.GetIndexer()
	s.ctx, s.cancel = context.WithCancel(klog.NewContext(context.Background(), logr.FromSlogHandler(s.log.Handler())))
	s.factory.StartWithContext(s.ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		s.cancel()
		s.factory.Shutdown()
		return nil, fmt.Errorf("kube: the watch of the job's pods did not sync: %w", cmp.Or(ctx.Err(), context.Canceled))
	}
	return s, nil
}

// ensureService creates the job's Service, or adopts the one there if it is the job's.
func (s *Scaler) ensureService(ctx context.Context) error {
	svcs := s.cfg.Client.CoreV1().Services(s.cfg.Namespace)
	for {
		got, err := svcs.Get(ctx, s.cfg.Job, metav1.GetOptions{})
		if err == nil {
			if !owned(got.Labels, s.cfg.Job) {
				return fmt.Errorf("%w: Service %s/%s exists without the job's labels (%s=%s)", ErrConflict, s.cfg.Namespace, s.cfg.Job, LabelJob, s.cfg.Job)
			}
			return nil
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("kube: get Service %s: %w", s.cfg.Job, err)
		}
		_, err = svcs.Create(ctx, s.service(), metav1.CreateOptions{})
		if err == nil {
			s.log.Info("created the job's Service", "service", s.cfg.Job)
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kube: create Service %s: %w", s.cfg.Job, err)
		}
	}
}

// observed is the informer's handler: it records a deleted pod's last state and wakes every
// node goroutine, which reads its pod's state from the informer's store.
func (s *Scaler) observed(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	s.mu.Lock()
	if deleted {
		s.gone[p.Name] = p
	}
	s.notifyLocked()
	s.mu.Unlock()
}

func (s *Scaler) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Scaler) notify() {
	s.mu.Lock()
	s.notifyLocked()
	s.mu.Unlock()
}

// changes returns the channel the next pod event or stop closes.
func (s *Scaler) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// look returns what the watch knows of pod name of uid: the pod, while it exists; its last
// state, once it is gone; neither, before the watch has seen it. Pod names are unique, so
// another pod under the name means that uid is gone (its last state unknown, when the watch
// missed its deletion).
func (s *Scaler) look(name string, uid types.UID) (live, gone *corev1.Pod) {
	obj, ok, _ := s.indexer.GetByKey(s.cfg.Namespace + "/" + name)
	p, isPod := obj.(*corev1.Pod)
	if ok && isPod && p.UID == uid {
		return p, nil
	}
	s.mu.Lock()
	g := s.gone[name]
	s.mu.Unlock()
	if g != nil && g.UID == uid {
		return nil, g
	}
	if ok && isPod {
		return nil, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.cfg.Namespace, UID: uid}}
	}
	return nil, nil
}

// SetReporter makes r the Reporter told of the pods that end by themselves from then on (nil:
// none). A coordinator is made after the first Scale has started its servers, so it is set
// here rather than in the Config.
func (s *Scaler) SetReporter(r Reporter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reporter = r
}

// Scale implements elastic.Scaler. Its first call creates the plan's server pods; every call
// creates the worker pods plan has and the scaler does not run (a node id whose pod exited
// with status 0 or used up its restarts is not started again while plan keeps it; one whose
// start failed is), asks again, at the plan's size, for every pod of a role whose size plan
// changes that the scheduler has not placed yet (deleted and created anew, the same
// incarnation; not waited for: the call that started it waits), and deletes the workers plan
// does not have, the highest-numbered first,
// each with the grace period Config.StopGrace: a worker's drain (SIGTERM, it finishes its batch
// and leaves). It returns once every pod it created runs (its container) or failed to start
// (the error joins the failures: ErrPending with the scheduler's message, a refused create),
// and every pod it deleted is gone; or when ctx ends (the deletions go on). After the first
// call, plan.Servers must be Plan().Servers (an error wrapping elastic.ErrInvalidConfig
// otherwise, and nothing changes). A pod the apiserver refuses to delete (RBAC, say) fails
// Scale with that error and keeps it, and the workers below it, in Plan(). ErrClosed after
// Close.
func (s *Scaler) Scale(ctx context.Context, plan elastic.Plan) error {
	if err := plan.Validate(); err != nil {
		return err
	}
	s.changeMu.Lock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.changeMu.Unlock()
		return elastic.ErrClosed
	}
	if s.serversSet && plan.Servers != s.plan.Servers {
		cur := s.plan.Servers
		s.mu.Unlock()
		s.changeMu.Unlock()
		return fmt.Errorf("%w: %d parameter servers asked for, the scaler runs %d: change the number through the coordinator (SetParallelism), which moves the slots and calls StartServers or StopServers",
			elastic.ErrInvalidConfig, plan.Servers, cur)
	}
	var stopping []*node
	for _, n := range s.nodes {
		if n.role == elastic.RoleWorker && n.index >= plan.Workers {
			stopping = append(stopping, n)
		}
	}
	slices.SortFunc(stopping, func(a, b *node) int { return b.index - a.index })
	s.mu.Unlock()

	stopped, stopErr := s.stopNodes(ctx, stopping)
	s.mu.Lock()
	if stopErr != nil {
		plan.Workers = stopping[len(stopped)].index + 1
	}
	for _, n := range stopped {
		delete(s.nodes, n.id)
	}
	var started []*node
	if !s.closed {
		if !s.serversSet {
			for i := range plan.Servers {
				started = s.startLocked(started, elastic.RoleServer, i, plan.Server)
			}
		}
		for i := range plan.Workers {
			started = s.startLocked(started, elastic.RoleWorker, i, plan.Worker)
		}
		s.resizePendingLocked(s.plan, plan)
		s.plan, s.serversSet = plan, true
	}
	closed := s.closed
	s.mu.Unlock()
	s.changeMu.Unlock()
	if closed {
		return elastic.ErrClosed
	}
	err := s.await(ctx, started, stopped)
	return errors.Join(stopErr, err)
}

// startLocked starts node id role/index of size unless the plan runs it already (or it is
// done for good), and appends it to started. s.mu is held.
func (s *Scaler) startLocked(started []*node, role elastic.Role, index int, size elastic.Resources) []*node {
	id := elastic.WorkerID(index)
	if role == elastic.RoleServer {
		id = elastic.ServerID(index)
	}
	if n := s.nodes[id]; n != nil && !(n.finished && n.retry) {
		return started
	}
	n := &node{role: role, id: id, index: index, name: PodName(s.cfg.Job, id), prev: s.last[id], size: size,
		ready: make(chan struct{}), done: make(chan struct{})}
	s.nodes[id], s.last[id] = n, n
	s.wg.Add(1)
	go s.supervise(n)
	return append(started, n)
}

// await waits until every node of started runs a pod or failed to start, and every node of
// stopped is gone, or ctx ends. It returns the failures to start.
func (s *Scaler) await(ctx context.Context, started, stopped []*node) error {
	var errs []error
	for _, n := range started {
		select {
		case <-n.ready:
			if n.startErr != nil {
				errs = append(errs, n.startErr)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, n := range stopped {
		select {
		case <-n.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.Join(errs...)
}

// stopNodes stops nodes, in order, until one fails to; it returns those it stopped and the
// failure.
func (s *Scaler) stopNodes(ctx context.Context, nodes []*node) ([]*node, error) {
	for i, n := range nodes {
		if err := s.stopNode(ctx, n); err != nil {
			return nodes[:i], err
		}
	}
	return nodes, nil
}

// stopNode deletes node n's pod with the grace period Config.StopGrace and tells its goroutine,
// which waits for the pod to be gone and deletes any pod it creates meanwhile. A deletion the
// apiserver refuses leaves n running, and is returned. ctx is the caller's: the deletion is
// made whatever becomes of it.
func (s *Scaler) stopNode(ctx context.Context, n *node) error {
	s.mu.Lock()
	if n.stop != stopNone {
		s.mu.Unlock()
		return nil
	}
	n.stop = stopAsked
	uid := n.uid
	del := uid != "" && n.deleted != uid
	s.mu.Unlock()
	var err error
	if del {
		// Not cut short by ctx: a deletion the apiserver made while its answer was on the way
		// must not count as refused.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		err = s.deletePod(dctx, n.name, uid, s.cfg.StopGrace)
		cancel()
	}
	s.mu.Lock()
	if err != nil {
		n.stop = stopNone
	} else {
		n.stop = stopSet
		if del {
			n.deleted = uid
		}
	}
	s.notifyLocked()
	s.mu.Unlock()
	return err
}

// deletePod deletes pod name of uid with grace; a pod gone already, or replaced, is no error.
func (s *Scaler) deletePod(ctx context.Context, name string, uid types.UID, grace time.Duration) error {
	secs := int64((grace + time.Second - 1) / time.Second)
	err := s.pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &secs, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("kube: delete pod %s: %w", name, err)
}

// StartServers implements elastic.ServerScaler: it creates server pods ps-k .. ps-(k+n-1)
// after the plan's k and, once every one runs, returns them as Config.Server gives them at
// their ServerAddr (a program may take a moment to listen: the coordinator waits for it to
// answer). If one fails to start (ErrPending, say) or ctx ends, it deletes them all, leaves
// the plan at k servers and returns none. Without Config.Server it fails with
// errors.ErrUnsupported and creates none.
func (s *Scaler) StartServers(ctx context.Context, n int) ([]elastic.ParameterServer, error) {
	if s.cfg.Server == nil {
		return nil, fmt.Errorf("kube: the scaler cannot reach the servers it starts (Config.Server): %w", errors.ErrUnsupported)
	}
	if n < 0 {
		return nil, fmt.Errorf("%w: start %d servers", elastic.ErrInvalidConfig, n)
	}
	s.serversMu.Lock()
	defer s.serversMu.Unlock()
	s.changeMu.Lock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.changeMu.Unlock()
		return nil, elastic.ErrClosed
	}
	k := s.plan.Servers
	var started []*node
	for i := k; i < k+n; i++ {
		started = s.startLocked(started, elastic.RoleServer, i, s.plan.Server)
	}
	s.plan.Servers, s.serversSet = k+n, true
	s.mu.Unlock()
	s.changeMu.Unlock()

	err := s.await(ctx, started, nil)
	var out []elastic.ParameterServer
	for _, nd := range started {
		if err != nil {
			break
		}
		var srv elastic.ParameterServer
		if srv, err = s.cfg.Server(nd.id, ServerAddr(s.cfg.Job, s.cfg.Namespace, s.cfg.ClusterDomain, nd.index, s.cfg.Port)); err != nil {
			err = fmt.Errorf("kube: server %s: %w", nd.id, err)
		} else {
			out = append(out, srv)
		}
	}
	if err == nil {
		return out, nil
	}
	for _, srv := range out {
		if c, ok := srv.(io.Closer); ok {
			c.Close()
		}
	}
	return nil, errors.Join(fmt.Errorf("kube: start %d servers: %w", n, err), s.unstart(ctx, started, k))
}

// unstart deletes the server nodes a failed StartServers started and sets the server count
// back to k. It waits for them to be gone for StopGrace and a margin, whatever ctx says.
func (s *Scaler) unstart(ctx context.Context, nodes []*node, k int) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.StopGrace+closeMargin)
	defer cancel()
	s.changeMu.Lock()
	var errs []error
	for _, n := range nodes {
		if err := s.stopNode(ctx, n); err != nil {
			errs = append(errs, err)
		}
	}
	s.mu.Lock()
	for _, n := range nodes {
		delete(s.nodes, n.id)
	}
	s.plan.Servers = k
	s.mu.Unlock()
	s.changeMu.Unlock()
	return errors.Join(append(errs, s.await(ctx, nil, nodes))...)
}

// StopServers implements elastic.ServerScaler: it deletes the pods of the servers ids, which
// must be the plan's highest-numbered (an error wrapping elastic.ErrInvalidConfig otherwise, and
// none is deleted), with the grace period Config.StopGrace, and waits until they are gone or ctx
// ends (the deletions go on). A deletion the apiserver refuses (RBAC, say) fails with its error
// and keeps that server, and those below it, in Plan().
func (s *Scaler) StopServers(ctx context.Context, ids []string) error {
	s.serversMu.Lock()
	defer s.serversMu.Unlock()
	s.changeMu.Lock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.changeMu.Unlock()
		return elastic.ErrClosed
	}
	cur := s.plan.Servers
	k := cur - len(ids)
	var stopping []*node
	for i, id := range ids {
		n := s.nodes[id]
		if k < 0 || slices.Contains(ids[:i], id) || n == nil || n.role != elastic.RoleServer || n.index < k {
			s.mu.Unlock()
			s.changeMu.Unlock()
			return fmt.Errorf("%w: server %q is not among the plan's highest-numbered %d (or named twice)", elastic.ErrInvalidConfig, id, len(ids))
		}
		stopping = append(stopping, n)
	}
	slices.SortFunc(stopping, func(a, b *node) int { return b.index - a.index })
	s.mu.Unlock()
	stopped, stopErr := s.stopNodes(ctx, stopping)
	s.mu.Lock()
	for _, n := range stopped {
		delete(s.nodes, n.id)
	}
	s.plan.Servers = cur - len(stopped)
	s.mu.Unlock()
	s.changeMu.Unlock()
	return errors.Join(stopErr, s.await(ctx, nil, stopped))
}

// Plan implements elastic.Scaler.
func (s *Scaler) Plan() elastic.Plan {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.plan
}

// Pods returns the node ids of the plan with their newest pods, the servers then the workers,
// each in index order. After Close, those it stopped.
func (s *Scaler) Pods() []PodStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PodStatus, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, PodStatus{Role: n.role, ID: n.id, Pod: n.name, UID: n.uid, Phase: n.phase, Restarts: n.restarts,
			Size: n.size, Running: n.running, Done: n.finished, Last: n.last, Err: n.result})
		if n.redo != nil {
			out[len(out)-1].Resize = n.redo.size
		}
		if n.uid == "" {
			out[len(out)-1].Pod = ""
		}
	}
	slices.SortFunc(out, func(a, b PodStatus) int {
		if a.Role != b.Role {
			return int(a.Role) - int(b.Role) // servers first
		}
		return indexOf(a.ID) - indexOf(b.ID)
	})
	return out
}

// Close implements elastic.Scaler, for a job that ends: it deletes the workers' pods and waits
// until they are gone, then the servers' (those it adopted too), each with the grace period
// Config.StopGrace; pods still there StopGrace and a margin later are deleted at once. Then it
// stops watching. It returns the deletions the apiserver refused. Idempotent; after Leave it
// does nothing.
func (s *Scaler) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

// Leave stops watching and leaves every pod of the job running, for the next coordinator's
// scaler to adopt: what a coordinator that hands its job over does (its pod is deleted or moved
// while the job goes on). Scale, StartServers and StopServers fail with elastic.ErrClosed from
// then on. Idempotent; after Close it does nothing.
func (s *Scaler) Leave() {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		nodes := slices.Collect(maps.Values(s.last))
		s.mu.Unlock()
		for _, n := range nodes {
			s.release(n)
		}
		s.cancel()
		s.wg.Wait()
		s.factory.Shutdown()
	})
}

func (s *Scaler) close() error {
	s.mu.Lock()
	s.closed = true
	var workers, servers []*node
	for _, n := range s.last {
		if n.role == elastic.RoleWorker {
			workers = append(workers, n)
		} else {
			servers = append(servers, n)
		}
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StopGrace+closeMargin)
	defer cancel()
	var errs []error
	for _, group := range [][]*node{workers, servers} {
		for _, n := range group {
			if err := s.stopNode(ctx, n); err != nil {
				errs = append(errs, err)
				s.release(n)
			}
		}
		for _, n := range group {
			select {
			case <-n.done:
			case <-ctx.Done():
			}
		}
	}
	if ctx.Err() != nil {
		// Pods on a node whose kubelet is gone never finish a graceful deletion.
		fctx, fcancel := context.WithTimeout(context.Background(), closeMargin)
		for _, n := range append(workers, servers...) {
			s.mu.Lock()
			uid, left := n.uid, n.stop == stopSet
			s.mu.Unlock()
			select {
			case <-n.done:
				continue
			default:
			}
			if left && uid != "" {
				s.log.Warn("pod not gone after its grace period: deleting it at once", "pod", n.name)
				if err := s.deletePod(fctx, n.name, uid, 0); err != nil {
					errs = append(errs, err)
				}
			}
		}
		fcancel()
	}
	s.cancel()
	s.wg.Wait()
	s.factory.Shutdown()
	return errors.Join(errs...)
}

// release makes node n's goroutine end and leave its pod running.
func (s *Scaler) release(n *node) {
	s.mu.Lock()
	n.stop = stopRelease
	s.notifyLocked()
	s.mu.Unlock()
}

// emit calls Config.OnEvent.
func (s *Scaler) emit(ev Event) {
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(ev)
	}
}
