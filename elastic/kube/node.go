package kube

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
)

// stopMode is what the scaler asks of a node's goroutine.
type stopMode uint8

const (
	stopNone    stopMode = iota
	stopAsked            // a stop is deleting the pod: hold on until it is set or withdrawn
	stopSet              // stopped: the pod is being deleted; delete any other, and end once gone
	stopRelease          // end now and leave the pod (Close, for a pod it may not or cannot delete)
)

// node is one node id's life under the scaler, from its first pod to its end; replacement pods
// keep the node. Its goroutine (supervise) owns the pods; the fields under Scaler.mu are what
// the callers read and the stops they ask.
type node struct {
	role  elastic.Role
	id    string
	index int
	name  string // the pod's name
	prev  *node  // the node id's earlier node, maybe still deleting its pod: read by the goroutine only

	ready    chan struct{} // closed once a pod runs, or the node is done without one (startErr)
	done     chan struct{} // closed when the goroutine ends: the pod gone, or left (released, Close)
	startErr error         // why no pod ran; set before ready is closed

	// Guarded by Scaler.mu.
	stop     stopMode
	deleted  types.UID // the pod whose graceful deletion a stop issued
	size     elastic.Resources
	restarts int
	uid      types.UID // the newest pod
	phase    corev1.PodPhase
	running  bool
	last     Event
	result   error
	finished bool
	retry    bool // done because a start failed: a later Scale starts the node id anew
	// asked is when the newest pod was created at its size; scheduled says the scheduler has
	// placed it, and unschedulable is the scheduler's message while it finds no node for it.
	asked         time.Time
	scheduled     bool
	unschedulable string
	// redo asks the goroutine for a pod of another size (Scale, RestartServer).
	redo *redo
}

// redo is a pod asked for again at another size: a pending pod at a plan's new size (Scale),
// or a running server larger (RestartServer), which is a new incarnation.
type redo struct {
	size    elastic.Resources
	running bool   // the pod is replaced even once scheduled or running
	reason  string // why, for the Reporter and the log
}

// errQuit ends a node's goroutine when Close has cancelled the scaler's context, or released it.
var errQuit = errors.New("kube: scaler closed")

// supervise runs node n: it creates its pod, follows it, replaces it after an abnormal end up
// to the restart limit, and deletes it when stopped.
func (s *Scaler) supervise(n *node) {
	defer s.wg.Done()
	defer close(n.done)
	var readyOnce sync.Once
	ready := func() { readyOnce.Do(func() { close(n.ready) }) }
	defer func() {
		readyOnce.Do(func() { // never ran and not finished: Close
			n.startErr = elastic.ErrClosed
			close(n.ready)
		})
	}()
	if n.prev != nil {
		select { // the name is free once the earlier pod is gone
		case <-n.prev.done:
		case <-s.ctx.Done():
			return
		}
		n.prev = nil
	}
	log := s.log.With("role", n.role.String(), "id", n.id)
	s.mu.Lock()
	size, restart := n.size, 0
	s.mu.Unlock()
	for {
		s.mu.Lock()
		if r := n.redo; r != nil {
			n.redo = nil
			if r.running {
				size = larger(size, r.size)
			} else {
				size = r.size
			}
		}
		n.size = size // the pod on its way: RestartServer compares with it
		s.mu.Unlock()
		l := s.launch(n, restart, size)
		uid, adopted, err := s.start(n, l)
		switch {
		case errors.Is(err, errQuit):
			return
		case errors.Is(err, ErrStopped):
			s.finish(n, err, false, ready)
			return
		case err != nil:
			log.Error("pod could not be created", "pod", n.name, "err", err)
			s.emit(Event{Launch: l, Pod: n.name, Kind: EventRefused, Message: err.Error(), Final: true})
			s.finish(n, err, true, ready)
			return
		}
		if adopted != nil { // the pod tells its start
			restart, _ = strconv.Atoi(adopted.Annotations[AnnotationRestart])
			size = sizeOf(adopted, s.cname)
			l = s.launch(n, restart, size)
		}
		s.mu.Lock()
		n.uid, n.restarts, n.size, n.phase, n.running = uid, restart, size, "", false
		n.asked, n.scheduled, n.unschedulable = time.Now(), false, ""
		s.mu.Unlock()

		ev, how := s.follow(n, l, uid, ready)
		ev.Launch = l
		switch how {
		case endQuit:
			return
		case endStopped:
			ev.Kind, ev.Final = EventStopped, true
			log.Info("pod deleted", "pod", n.name)
			s.emit(ev)
			s.finish(n, ErrStopped, false, ready)
			return
		case endPending:
			ev.Final = true
			log.Error("pod stayed unscheduled: deleting it", "pod", n.name, "after", s.cfg.PendingTimeout, "reason", ev.Message)
			s.emit(ev)
			err := fmt.Errorf("%w: pod %s for %v: %s", ErrPending, n.name, s.cfg.PendingTimeout, ev.Message)
			if e := s.deletePod(s.ctx, n.name, uid, 0); e != nil {
				log.Error("could not delete the pending pod", "pod", n.name, "err", e)
			}
			s.finish(n, err, true, ready)
			s.waitGone(n, uid)
			return
		case endRedo:
			s.mu.Lock()
			r := n.redo
			reporter := s.reporter
			s.mu.Unlock()
			if e := s.deletePod(s.ctx, n.name, uid, 0); e != nil {
				log.Error("could not delete the pod to start it at another size", "pod", n.name, "err", e)
			}
			if err := s.waitGone(n, uid); err != nil {
				return
			}
			if r == nil || !r.running {
				log.Info("pending pod asked for again at the plan's new size", "pod", n.name)
				continue // never ran: the same incarnation
			}
			log.Warn("server restarted larger", "pod", n.name, "size", r.size, "reason", r.reason)
			if reporter != nil {
				reporter.ServerFailed(n.id, fmt.Sprintf("pod %s restarted with %v: %s", n.name, r.size, r.reason))
			}
			restart++
			continue
		}
		// The pod ended by itself.
		abnormal := ev.Abnormal()
		final := !abnormal || restart >= s.cfg.MaxRestarts
		ev.Final = final
		s.mu.Lock()
		n.last, n.running = ev, false
		reporter := s.reporter
		s.mu.Unlock()
		if abnormal {
			log.Warn("pod ended", "event", ev.String(), "restart", restart, "replaced", !final)
		} else {
			log.Info("pod ended", "event", ev.String())
		}
		if reporter != nil {
			if n.role == elastic.RoleServer {
				reporter.ServerFailed(n.id, ev.String())
			} else if abnormal {
				reporter.Fail(n.id, ev.String())
			}
		}
		if ev.Kind == EventOOMKilled && n.role == elastic.RoleServer {
			s.mu.Lock()
			s.oomKills = append(s.oomKills, autoscale.OOMKill{ID: n.id, MemoryLimit: ev.MemoryLimit})
			s.mu.Unlock()
		}
		s.emit(ev)
		if final {
			var err error
			if abnormal {
				err = fmt.Errorf("%s %s: %w (%d restarts): %s", n.role, n.id, ErrRestartLimit, restart, ev)
			}
			s.finish(n, err, false, ready)
			s.linger(n, uid) // the ended pod stays, for its logs, until the node is stopped
			return
		}
		// A replacement, once the ended pod is gone.
		if e := s.deletePod(s.ctx, n.name, uid, 0); e != nil {
			log.Error("could not delete the ended pod", "pod", n.name, "err", e)
		}
		if err := s.waitGone(n, uid); err != nil {
			return
		}
		if ev.Kind == EventOOMKilled {
			size = s.grown(size, ev.MemoryLimit)
		}
		restart++
	}
}

// finish marks node n done for good with err (retry: its start failed, a later Scale may start
// it again).
func (s *Scaler) finish(n *node, err error, retry bool, ready func()) {
	s.mu.Lock()
	n.finished, n.result, n.retry, n.running = true, err, retry, false
	select {
	case <-n.ready:
	default:
		n.startErr = err
	}
	s.mu.Unlock()
	ready()
}

// start creates node n's pod for start l and returns its uid. A live pod of the job under the
// name (an earlier scaler's) is adopted instead, and returned; an ended one is deleted first,
// and one being deleted waited for. ErrStopped: the node was stopped before; errQuit: the
// scaler closed.
func (s *Scaler) start(n *node, l Launch) (types.UID, *corev1.Pod, error) {
	pod := s.pod(l)
	for {
		ch := s.changes()
		s.mu.Lock()
		stop := n.stop
		s.mu.Unlock()
		switch stop {
		case stopSet:
			return "", nil, ErrStopped
		case stopRelease:
			return "", nil, errQuit
		case stopAsked:
			select {
			case <-ch:
				continue
			case <-s.ctx.Done():
				return "", nil, errQuit
			}
		}
		var there *corev1.Pod
		if obj, ok, _ := s.indexer.GetByKey(s.cfg.Namespace + "/" + n.name); ok {
			there, _ = obj.(*corev1.Pod)
		}
		if there == nil {
			created, err := s.pods.Create(s.ctx, pod, metav1.CreateOptions{})
			if err == nil {
				s.log.Info("pod created", "pod", n.name, "restart", l.Restart, "size", l.Size)
				return created.UID, nil, nil
			}
			if s.ctx.Err() != nil {
				return "", nil, errQuit
			}
			if !apierrors.IsAlreadyExists(err) {
				return "", nil, fmt.Errorf("kube: create pod %s: %w", n.name, err)
			}
			if there, err = s.pods.Get(s.ctx, n.name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				continue
			} else if err != nil {
				return "", nil, fmt.Errorf("kube: get pod %s: %w", n.name, err)
			}
		}
		if !owned(there.Labels, s.cfg.Job) || there.Labels[LabelNode] != n.id {
			return "", nil, fmt.Errorf("%w: pod %s/%s exists and is not node %s of job %s", ErrConflict, s.cfg.Namespace, n.name, n.id, s.cfg.Job)
		}
		if there.DeletionTimestamp == nil && !terminal(there) {
			s.log.Info("adopting the job's pod that runs already", "pod", n.name, "uid", there.UID)
			return there.UID, there, nil
		}
		if there.DeletionTimestamp == nil {
			if err := s.deletePod(s.ctx, n.name, there.UID, 0); err != nil {
				return "", nil, err
			}
		}
		if err := s.waitGone(n, there.UID); err != nil {
			return "", nil, err
		}
	}
}

// waitGone waits until pod uid of node n is gone. errQuit: the scaler closed, or released n.
func (s *Scaler) waitGone(n *node, uid types.UID) error {
	for {
		ch := s.changes()
		if _, gone := s.look(n.name, uid); gone != nil {
			return nil
		}
		s.mu.Lock()
		stop := n.stop
		s.mu.Unlock()
		if stop == stopRelease {
			return errQuit
		}
		select {
		case <-ch:
		case <-s.ctx.Done():
			return errQuit
		}
	}
}

// linger keeps node n, done for good, until its pod uid is gone: deleted when n is stopped, or
// by anyone else.
func (s *Scaler) linger(n *node, uid types.UID) {
	for {
		ch := s.changes()
		if _, gone := s.look(n.name, uid); gone != nil {
			return
		}
		s.mu.Lock()
		stop, deleted := n.stop, n.deleted
		if stop == stopSet {
			n.deleted = uid
		}
		s.mu.Unlock()
		switch {
		case stop == stopRelease:
			return
		case stop == stopSet && deleted != uid:
			if err := s.deletePod(s.ctx, n.name, uid, s.cfg.StopGrace); err != nil {
				s.log.Error("could not delete the pod", "pod", n.name, "err", err)
			}
		}
		select {
		case <-ch:
		case <-s.ctx.Done():
			return
		}
	}
}

// How a pod's follow ended.
type endHow uint8

const (
	endItself  endHow = iota // it ended by itself (the event says how)
	endStopped               // the scaler deleted it, and it is gone
	endPending               // it stayed unscheduled too long; it is still there
	endQuit                  // the scaler closed, or released the node
	endRedo                  // asked for at another size (node.redo); the pod is still there
)

// follow watches pod uid of node n, started as l, until it ends, and returns how, with its
// event. It emits EventRunning when the container runs, and calls ready then.
func (s *Scaler) follow(n *node, l Launch, uid types.UID, ready func()) (Event, endHow) {
	since := time.Now()
	deadline := time.NewTimer(s.cfg.PendingTimeout)
	defer deadline.Stop()
	ran, seen, told := false, false, false
	for {
		ch := s.changes()
		live, gone := s.look(n.name, uid)
		s.mu.Lock()
		stop, deleted := n.stop, n.deleted
		var unsched *corev1.PodCondition
		redoNow := false
		if live != nil {
			n.phase = live.Status.Phase
			n.running = running(live, s.cname) && live.DeletionTimestamp == nil
			n.scheduled = live.Spec.NodeName != ""
			if unsched = unscheduled(live); unsched != nil && !n.scheduled {
				n.unschedulable = unsched.Message
			} else {
				unsched, n.unschedulable = nil, ""
			}
			if r := n.redo; r != nil && live.DeletionTimestamp == nil && !terminal(live) {
				if r.running || !n.scheduled {
					redoNow = true
				} else {
					n.redo = nil // scheduled meanwhile: it keeps its size
				}
			}
		}
		s.mu.Unlock()
		if stop == stopRelease {
			return Event{}, endQuit
		}
		switch {
		case gone != nil:
			if stop == stopSet {
				return Event{Pod: n.name, UID: uid}, endStopped
			}
			if stop == stopNone {
				return endOf(gone, s.cname, true), endItself
			}
		case stop == stopSet:
			if deleted != uid {
				if err := s.deletePod(s.ctx, n.name, uid, s.cfg.StopGrace); err != nil {
					s.log.Error("could not delete the pod", "pod", n.name, "err", err)
				}
				s.mu.Lock()
				n.deleted = uid
				s.mu.Unlock()
			}
		case stop == stopAsked:
		case redoNow && stop == stopNone:
			return Event{Pod: n.name, UID: uid}, endRedo
		case live != nil:
			seen = true
			if unsched != nil && !told {
				told = true
				s.emit(Event{Launch: l, Pod: n.name, UID: uid, Kind: EventUnschedulable, Reason: unsched.Reason, Message: unsched.Message,
					MemoryLimit: memoryLimit(live, s.cname)})
				s.log.Warn("the scheduler finds no node for the pod", "pod", n.name, "reason", unsched.Reason, "message", unsched.Message)
			}
			switch {
			case live.DeletionTimestamp != nil: // deleted behind the scaler's back: acted on once gone
			case terminal(live):
				return endOf(live, s.cname, false), endItself
			case running(live, s.cname):
				if !ran {
					ran = true
					s.emit(Event{Launch: l, Pod: n.name, UID: uid, Kind: EventRunning, MemoryLimit: memoryLimit(live, s.cname)})
					ready()
				}
			case live.Spec.NodeName == "" && time.Since(since) >= s.cfg.PendingTimeout:
				ev := Event{Pod: n.name, UID: uid, Kind: EventPending, Reason: "NotScheduled",
					Message: "the scheduler has not placed the pod", MemoryLimit: memoryLimit(live, s.cname)}
				if c := unscheduled(live); c != nil {
					ev.Reason, ev.Message = c.Reason, c.Message
				}
				return ev, endPending
			}
		case !seen && time.Since(since) >= s.cfg.PendingTimeout:
			// Not seen yet, long after its creation: the watch may have missed a quick end.
			if _, err := s.pods.Get(s.ctx, n.name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return Event{Pod: n.name, UID: uid, Kind: EventDeleted}, endItself
			}
		}
		select {
		case <-ch:
		case <-deadline.C:
		case <-s.ctx.Done():
			return Event{}, endQuit
		}
	}
}

// sizeOf returns the size container c of p was given (its limits).
func sizeOf(p *corev1.Pod, c string) elastic.Resources {
	var r elastic.Resources
	for _, ct := range p.Spec.Containers {
		if ct.Name != c {
			continue
		}
		if q, ok := ct.Resources.Limits[corev1.ResourceCPU]; ok {
			r.CPUs = float64(q.MilliValue()) / 1000
		}
		if q, ok := ct.Resources.Limits[corev1.ResourceMemory]; ok {
			r.Memory = q.Value()
		}
	}
	return r
}

// larger returns the larger of a and b in each resource.
func larger(a, b elastic.Resources) elastic.Resources {
	return elastic.Resources{CPUs: max(a.CPUs, b.CPUs), Memory: max(a.Memory, b.Memory)}
}

// covers reports whether a is at least b in every resource b sets.
func covers(a, b elastic.Resources) bool {
	return (b.CPUs == 0 || a.CPUs >= b.CPUs) && (b.Memory == 0 || a.Memory >= b.Memory)
}

// indexOf returns i of ServerID(i) or WorkerID(i).
func indexOf(id string) int {
	i, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	return i
}
