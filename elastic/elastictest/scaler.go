package elastictest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/elasticps/elasticps/elastic"
)

// Op names a call of a Recorder.
type Op uint8

const (
	OpScale Op = iota + 1
	OpStartServers
	OpStopServers
)

// String returns the op's method name, "Scale" for OpScale.
func (o Op) String() string {
	switch o {
	case OpScale:
		return "Scale"
	case OpStartServers:
		return "StartServers"
	case OpStopServers:
		return "StopServers"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// ScalerCall is one call a Recorder got.
type ScalerCall struct {
	Op Op
	// Plan is Scale's.
	Plan elastic.Plan
	// N is StartServers'.
	N int
	// IDs is StopServers'.
	IDs []string
	// Err is what the call returned.
	Err error
}

// String returns the call as "Scale(2 servers, 4 workers)", "StartServers(1)" or
// "StopServers([ps-2])", with ": " and the error after a call that failed.
func (c ScalerCall) String() string {
	var s string
	switch c.Op {
	case OpScale:
		s = fmt.Sprintf("Scale(%v)", c.Plan)
	case OpStartServers:
		s = fmt.Sprintf("StartServers(%d)", c.N)
	case OpStopServers:
		s = fmt.Sprintf("StopServers(%v)", c.IDs)
	default:
		s = c.Op.String()
	}
	if c.Err != nil {
		s += ": " + c.Err.Error()
	}
	return s
}

// ServerPool starts and stops a job's parameter servers for a ServerScaler: *Job is one.
type ServerPool interface {
	// StartServers starts n more servers, numbered on from the pool's, and returns them.
	StartServers(ctx context.Context, n int) ([]elastic.ParameterServer, error)
	// StopServers stops the servers with the given ids, the highest-numbered.
	StopServers(ctx context.Context, ids []string) error
}

// RecorderConfig configures a Recorder.
type RecorderConfig struct {
	// Servers is the job's server count when the recorder is made (its Plan before any Scale).
	// Default 0: the first Scale sets it, as a scaler that starts the servers itself does.
	Servers int
	// Pool, if set, starts and stops the servers of StartServers and StopServers. Nil:
	// StartServers fails with errors.ErrUnsupported, and StopServers only counts.
	Pool ServerPool
}

// Recorder is an elastic.ServerScaler that runs nothing: it records the calls it gets, keeps
// the books of the processes the Scaler contract says it would run (Procs), and fails the calls
// a test tells it to (Fail). Its servers, when it starts any, are its Pool's. It obeys the
// contract (TestScaler checks it), so a coordinator driven by it behaves as with a real scaler.
// Safe for concurrent use.
type Recorder struct {
	pool ServerPool

	mu     sync.Mutex
	plan   elastic.Plan
	set    bool // the server count is set (RecorderConfig.Servers or the first Scale)
	calls  []ScalerCall
	fail   map[Op]error
	procs  Procs          // the processes it would run
	starts map[string]int // per node id, the processes it started
	closed bool
}

var _ elastic.ServerScaler = (*Recorder)(nil)

// NewRecorder returns a recorder that runs no worker yet.
func NewRecorder(cfg RecorderConfig) *Recorder {
	r := &Recorder{pool: cfg.Pool, fail: map[Op]error{}, procs: Procs{}, starts: map[string]int{}}
	if cfg.Servers > 0 {
		r.set = true
		r.plan.Servers = cfg.Servers
		for i := range cfg.Servers {
			r.startLocked(elastic.ServerID(i))
		}
	}
	return r
}

// ScalerOnly returns the recorder as a plain elastic.Scaler, one that does not start servers: a
// coordinator given it refuses to change the server count (errors.ErrUnsupported) without
// calling it. Its calls are the recorder's.
func (r *Recorder) ScalerOnly() elastic.Scaler { return scalerOnly{r} }

// scalerOnly hides the Recorder's ServerScaler methods.
type scalerOnly struct{ r *Recorder }

func (s scalerOnly) Scale(ctx context.Context, plan elastic.Plan) error { return s.r.Scale(ctx, plan) }
func (s scalerOnly) Plan() elastic.Plan                                 { return s.r.Plan() }
func (s scalerOnly) Close() error                                       { return s.r.Close() }

// Fail makes every later call of op fail with err, changing nothing, until Fail(op, nil).
func (r *Recorder) Fail(op Op, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.fail, op)
		return
	}
	r.fail[op] = err
}

// Calls returns every call the recorder got, in order.
func (r *Recorder) Calls() []ScalerCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// Plans returns the plans of the Scale calls that succeeded, in order.
func (r *Recorder) Plans() []elastic.Plan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []elastic.Plan
	for _, c := range r.calls {
		if c.Op == OpScale && c.Err == nil {
			out = append(out, c.Plan)
		}
	}
	return out
}

// Procs returns the processes the recorder would run now: every node id with the number of
// its start ("1", "2", ...) as its process's identity.
func (r *Recorder) Procs() Procs {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(Procs, len(r.procs))
	for id, p := range r.procs {
		out[id] = p
	}
	return out
}

func (r *Recorder) record(c ScalerCall) error {
	r.calls = append(r.calls, c)
	return c.Err
}

func (r *Recorder) startLocked(id string) {
	r.starts[id]++
	r.procs[id] = strconv.Itoa(r.starts[id])
}

// Scale implements elastic.Scaler: it sets the workers the recorder would run, by the contract.
func (r *Recorder) Scale(ctx context.Context, plan elastic.Plan) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	call := ScalerCall{Op: OpScale, Plan: plan}
	switch err := plan.Validate(); {
	case r.closed:
		call.Err = elastic.ErrClosed
	case err != nil:
		call.Err = err
	case r.fail[OpScale] != nil:
		call.Err = r.fail[OpScale]
	case r.set && plan.Servers != r.plan.Servers:
		call.Err = fmt.Errorf("%w: %d parameter servers asked for, the scaler runs %d (StartServers and StopServers change them)", elastic.ErrInvalidConfig, plan.Servers, r.plan.Servers)
	}
	if call.Err != nil {
		return r.record(call)
	}
	if !r.set {
		r.set = true
		for i := range plan.Servers {
			r.startLocked(elastic.ServerID(i))
		}
	}
	for i := range plan.Workers {
		if id := elastic.WorkerID(i); r.procs[id] == "" {
			r.startLocked(id)
		}
	}
	for i := plan.Workers; i < r.plan.Workers; i++ {
		delete(r.procs, elastic.WorkerID(i))
	}
	r.plan = plan
	return r.record(call)
}

// Plan implements elastic.Scaler.
func (r *Recorder) Plan() elastic.Plan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.plan
}

// StartServers implements elastic.ServerScaler through the Pool.
func (r *Recorder) StartServers(ctx context.Context, n int) ([]elastic.ParameterServer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	call := ScalerCall{Op: OpStartServers, N: n}
	switch {
	case r.closed:
		call.Err = elastic.ErrClosed
	case n < 0:
		call.Err = fmt.Errorf("%w: start %d servers", elastic.ErrInvalidConfig, n)
	case r.fail[OpStartServers] != nil:
		call.Err = r.fail[OpStartServers]
	case r.pool == nil:
		call.Err = fmt.Errorf("elastictest: the recorder has no server pool: %w", errors.ErrUnsupported)
	}
	if call.Err != nil {
		return nil, r.record(call)
	}
	added, err := r.pool.StartServers(ctx, n)
	for range added {
		r.startLocked(elastic.ServerID(r.plan.Servers))
		r.plan.Servers++
	}
	call.Err = err
	return added, r.record(call)
}

// StopServers implements elastic.ServerScaler through the Pool.
func (r *Recorder) StopServers(ctx context.Context, ids []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	call := ScalerCall{Op: OpStopServers, IDs: slices.Clone(ids)}
	switch {
	case r.closed:
		call.Err = elastic.ErrClosed
	case r.fail[OpStopServers] != nil:
		call.Err = r.fail[OpStopServers]
	default:
		call.Err = highest(ids, r.plan.Servers)
	}
	if call.Err == nil && r.pool != nil {
		call.Err = r.pool.StopServers(ctx, ids)
	}
	if call.Err == nil {
		for _, id := range ids {
			delete(r.procs, id)
		}
		r.plan.Servers -= len(ids)
	}
	return r.record(call)
}

// highest checks that ids are the highest-numbered of n servers, each once.
func highest(ids []string, n int) error {
	k := n - len(ids)
	for i, id := range ids {
		ok := k >= 0 && !slices.Contains(ids[:i], id)
		if ok {
			ok = false
			for j := k; j < n; j++ {
				ok = ok || elastic.ServerID(j) == id
			}
		}
		if !ok {
			return fmt.Errorf("%w: server %q is not among the highest-numbered %d of %d", elastic.ErrInvalidConfig, id, len(ids), n)
		}
	}
	return nil
}

// Close implements elastic.Scaler: the recorder runs no worker from then on. Idempotent.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.closed = true
		for i := range r.plan.Workers {
			delete(r.procs, elastic.WorkerID(i))
		}
	}
	return nil
}
