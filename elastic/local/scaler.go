package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/elasticps/elasticps/elastic"

	"github.com/elasticps/elasticps/shard"
)

// ScalerConfig configures a Scaler.
type ScalerConfig struct {
	// Job is the in-process job whose workers the scaler runs. Required.
	Job *Job
	// Reader gives the reader configuration of a worker (its Source, BatchSize, ...); the
	// dispatcher is the job's. Required.
	Reader func(worker string) shard.ReaderConfig
	// Worker makes worker id's training function (Session.Step's), with whatever state it
	// keeps (its model replica, its buffers), each time the worker starts. Required.
	Worker func(id string) (StepFunc, error)
	// MaxRestarts is how many times a worker whose Step failed is started again (with a new
	// Session under the same name) before the scaler gives it up. Default 0: never.
	MaxRestarts int
	// Logger receives the workers' starts, ends and crashes. Nil discards.
	Logger *slog.Logger
}

// Scaler is the in-process elastic.Scaler: it runs a Job's workers as goroutines, each
// training through its own Session until the data is done, and starts a worker whose function
// failed again, up to MaxRestarts. The job's parameter servers are the Job's: Scale keeps their
// number (Plan().Servers is the job's), StartServers and StopServers change it (the coordinator
// calls them in a live repartition), and a server that dies (Job.KillServer) is not restarted by
// the scaler: Job.RestartServer does that. Safe for concurrent use.
type Scaler struct {
	cfg ScalerConfig
	log *slog.Logger

	mu      sync.Mutex
	plan    elastic.Plan
	workers map[string]*localWorker
	changed chan struct{} // closed and replaced when a worker ends
	closed  bool
	wg      sync.WaitGroup
}

// localWorker is one worker goroutine of a Scaler.
type localWorker struct {
	id      string
	index   int // i of WorkerID(i)
	cancel  context.CancelFunc
	ended   chan struct{} // closed when its goroutine has ended
	stopped bool          // Scale or Close stopped it
	done    bool
	err     error // why it ended, nil when its data was done
	// Counted over the name's workers (a name stopped and started again keeps its counts).
	starts   int
	restarts int
	steps    uint64
}

// StepFunc trains one batch: the function Session.Step runs.
type StepFunc = func(ctx context.Context, b *elastic.Batch) error

// WorkerStatus is one worker of a Scaler.
type WorkerStatus struct {
	ID      string
	Running bool
	// Starts counts the sessions the worker's name was started with: its first, its restarts,
	// and its starts after the scaler stopped it.
	Starts   int
	Restarts int
	// Steps counts the batches it trained, over its restarts.
	Steps uint64
	// Err is why it ended: nil when its data was done or the scaler stopped it.
	Err error
}

var _ elastic.Scaler = (*Scaler)(nil)

// NewScaler returns a scaler that runs no worker yet; Scale starts them.
func NewScaler(cfg ScalerConfig) (*Scaler, error) {
	var errs []error
	if cfg.Job == nil {
		errs = append(errs, errors.New("Job is required"))
	}
	if cfg.Reader == nil {
		errs = append(errs, errors.New("Reader is required"))
	}
	if cfg.Worker == nil {
		errs = append(errs, errors.New("Worker is required"))
	}
	if cfg.MaxRestarts < 0 {
		errs = append(errs, fmt.Errorf("MaxRestarts %d is negative", cfg.MaxRestarts))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", elastic.ErrInvalidConfig, errors.Join(errs...))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Scaler{cfg: cfg, log: log, workers: map[string]*localWorker{}, changed: make(chan struct{})}, nil
}

// Scale implements elastic.Scaler: it starts workers worker-0 .. worker-(plan.Workers-1) that
// do not run (a name the scaler stopped gets a new session once its old one has left), stops
// those beyond (each finishes the batch in hand and leaves cleanly) and returns once they have
// ended, or ctx ends. A worker that ended by itself (its data done, or given up) is not started
// again. plan.Servers must be the job's server count (an error wrapping
// elastic.ErrInvalidConfig otherwise, and nothing changes). The sizes are not enforced: every
// worker is a goroutine of this process.
func (s *Scaler) Scale(ctx context.Context, plan elastic.Plan) error {
	if err := plan.Validate(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return elastic.ErrClosed
	}
	if have := s.cfg.Job.serverCount(); plan.Servers != have {
		s.mu.Unlock()
		return fmt.Errorf("%w: %d parameter servers asked for, the job has %d: change the number through the coordinator (SetParallelism), which moves the slots", elastic.ErrInvalidConfig, plan.Servers, have)
	}
	for i := range plan.Workers {
		id := elastic.WorkerID(i)
		if w, ok := s.workers[id]; !ok || w.stopped {
			s.startLocked(id, i, w)
		}
	}
	var stopped []*localWorker
	for _, w := range s.workers {
		if w.index >= plan.Workers && !w.done {
			w.stopped = true
			w.cancel()
			stopped = append(stopped, w)
		}
	}
	s.plan = plan
	s.mu.Unlock()
	for _, w := range stopped {
		select {
		case <-w.ended:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// startLocked starts the goroutine of worker id, WorkerID(index), after prev (the name's
// earlier worker, nil if none) has ended. s.mu is held.
func (s *Scaler) startLocked(id string, index int, prev *localWorker) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &localWorker{id: id, index: index, cancel: cancel, ended: make(chan struct{}), starts: 1}
	if prev != nil {
		w.starts = prev.starts + 1
	}
	s.workers[id] = w
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(w.ended)
		defer cancel()
		var err error
		if prev != nil {
			select {
			case <-prev.ended: // a name is one live session
			case <-ctx.Done():
			}
			s.mu.Lock()
			w.restarts, w.steps = w.restarts+prev.restarts, w.steps+prev.steps
			s.mu.Unlock()
		}
		if ctx.Err() == nil {
			err = s.run(ctx, w)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		w.done, w.err = true, err
		if w.stopped {
			w.err = nil
		}
		close(s.changed)
		s.changed = make(chan struct{})
	}()
}

// run trains as worker w until its data is done, starting it again after a failure while it
// has restarts left.
func (s *Scaler) run(ctx context.Context, w *localWorker) error {
	for {
		err := s.session(ctx, w)
		if err == nil || ctx.Err() != nil {
			return err
		}
		s.mu.Lock()
		again := w.restarts < s.cfg.MaxRestarts
		if again {
			w.restarts++
			w.starts++
		}
		s.mu.Unlock()
		if !again {
			s.log.Error("worker failed; no restarts left", "worker", w.id, "restarts", w.restarts, "err", err)
			return err
		}
		s.log.Warn("worker failed; starting it again", "worker", w.id, "restart", w.restarts, "err", err)
	}
}

// session runs one Session of w to its end: nil when the data is done or training stopped.
func (s *Scaler) session(ctx context.Context, w *localWorker) error {
	step, err := s.cfg.Worker(w.id)
	if err != nil {
		return err
	}
	sess, err := s.cfg.Job.NewSession(w.id, s.cfg.Reader(w.id))
	if err != nil {
		return err
	}
	defer sess.Close()
	s.log.Info("worker started", "worker", w.id)
	for {
		err := sess.Step(ctx, step)
		switch {
		case err == nil:
			s.mu.Lock()
			w.steps++
			s.mu.Unlock()
		case errors.Is(err, io.EOF), errors.Is(err, elastic.ErrStopped):
			s.log.Info("worker done", "worker", w.id)
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		default:
			return err
		}
	}
}

// StartServers implements ServerScaler: the job starts the servers (Job.StartServers).
func (s *Scaler) StartServers(ctx context.Context, n int) ([]elastic.ParameterServer, error) {
	return s.cfg.Job.StartServers(ctx, n)
}

// StopServers implements ServerScaler: the job stops the servers (Job.StopServers).
func (s *Scaler) StopServers(ctx context.Context, ids []string) error {
	return s.cfg.Job.StopServers(ctx, ids)
}

var _ elastic.ServerScaler = (*Scaler)(nil)

// Plan implements elastic.Scaler: the last plan Scale ran, with the job's server count.
func (s *Scaler) Plan() elastic.Plan {
	n := s.cfg.Job.serverCount()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.plan
	p.Servers = n
	return p
}

// Workers returns every worker the scaler has started, by id.
func (s *Scaler) Workers() []WorkerStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]WorkerStatus, 0, len(s.workers))
	for _, w := range s.workers {
		out = append(out, WorkerStatus{ID: w.id, Running: !w.done, Starts: w.starts, Restarts: w.restarts, Steps: w.steps, Err: w.err})
	}
	slices.SortFunc(out, func(a, b WorkerStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Wait waits until every worker has ended, and returns the errors of those that failed for
// good.
func (s *Scaler) Wait(ctx context.Context) error {
	for {
		s.mu.Lock()
		var errs []error
		running := false
		for _, w := range s.workers {
			running = running || !w.done
			if w.err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", w.id, w.err))
			}
		}
		ch := s.changed
		s.mu.Unlock()
		if !running {
			return errors.Join(errs...)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close implements Scaler: it stops every worker (each leaves cleanly) and waits for them.
func (s *Scaler) Close() error {
	s.mu.Lock()
	s.closed = true
	for _, w := range s.workers {
		if !w.done {
			w.stopped = true
			w.cancel()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}
