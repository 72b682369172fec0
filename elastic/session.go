package elastic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/elasticps/elasticps/internal/wait"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// Control is the coordinator as a worker sees it: *Coordinator in the same process, or a
// client of a remote one. Every call may be repeated after an error.
type Control interface {
	// Join registers worker (again), which reads batches of batchSize records, and returns its
	// fence epoch.
	Join(ctx context.Context, worker string, batchSize int) (uint64, error)
	// Begin returns when worker may apply a batch (at once unless a checkpoint barrier is up).
	// ErrNotMember: join again; ErrStopped: training is over.
	Begin(ctx context.Context, worker string, epoch uint64) error
	// End reports the batch begun last: ok when applied and reported.
	End(ctx context.Context, worker string, epoch uint64, ok bool) error
	// Leave says worker stops cleanly.
	Leave(ctx context.Context, worker string, epoch uint64) error
}

var _ Control = (*Coordinator)(nil)

// SessionConfig configures a Session.
type SessionConfig struct {
	// Worker names the worker, unique among the job's live workers. Required.
	Worker string
	// Control is the coordinator. Required.
	Control Control
	// Client reaches the parameter servers; the session sets its fence epoch, so each session
	// needs a client of its own. Required; the session does not close it.
	Client *ps.Client
	// Reader configures the worker's shard reader (Service, Source, BatchSize, ...); Worker is
	// set by the session. Required: Service and Source.
	Reader shard.ReaderConfig
	// Retries is how many times a batch whose function failed is run again before the session
	// gives up (a retry is safe: the servers apply each batch position at most once per slot).
	// Failures for want of a parameter server (unreachable, or not serving its slots yet: a
	// server being recovered) do not count: they are retried until ApplyTimeout. Default 2.
	Retries int
	// RetryBackoff is the wait before the first retry, doubled for each next one. Default 50ms.
	RetryBackoff time.Duration
	// ApplyTimeout bounds a batch once begun: its function runs under a context that the
	// caller's cancellation does not end (a stopping worker finishes the batch in hand, so a
	// final checkpoint finds no batch half applied) but this timeout does. Default 1m.
	ApplyTimeout time.Duration
	// Logger receives the session's events. Nil discards. The records do not name the worker:
	// give a logger With its identity where several share a log (local.Job.NewSession adds
	// the job, "role" and "node").
	Logger *slog.Logger
}

// Session is one worker's access to training: Step reads a batch, waits out a checkpoint
// barrier, runs the program's function on it (whose pushes carry the worker's fence epoch and
// the batch's position), reports it to the dispatcher and counts it. A Session is used by one
// goroutine at a time; Close is safe from any.
type Session struct {
	cfg SessionConfig
	log *slog.Logger
	rc  shard.ReaderConfig

	mu     sync.Mutex
	reader *shard.Reader // replaced when the worker joins again
	epoch  uint64
	steps  uint64
	failed error
	closed bool
}

// NewSession returns a session; it joins the job at the first Step.
func NewSession(cfg SessionConfig) (*Session, error) {
	var errs []error
	if cfg.Worker == "" {
		errs = append(errs, errors.New("Worker is required"))
	}
	if cfg.Control == nil {
		errs = append(errs, errors.New("Control is required"))
	}
	if cfg.Client == nil {
		errs = append(errs, errors.New("Client is required"))
	}
	if cfg.Retries < 0 {
		errs = append(errs, fmt.Errorf("Retries %d is negative", cfg.Retries))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	if cfg.Retries == 0 {
		cfg.Retries = 2
	}
	if cfg.RetryBackoff <= 0 {
		cfg.RetryBackoff = 50 * time.Millisecond
	}
	if cfg.ApplyTimeout <= 0 {
		cfg.ApplyTimeout = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	rc := cfg.Reader
	rc.Worker = cfg.Worker
	if rc.Logger == nil {
		rc.Logger = cfg.Logger
	}
	r, err := shard.NewReader(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: reader: %w", ErrInvalidConfig, err)
	}
	return &Session{cfg: cfg, log: cfg.Logger, rc: rc, reader: r}, nil
}

// Batch is a batch of training data as a step's function sees it: the records, and pushes that
// carry the step, the worker's fence epoch and the batch's position.
type Batch struct {
	*shard.Batch
	// Step is the worker's step number (1 for its first batch), passed to the servers' optimizers.
	Step uint64
	s    *Session
	// pushed are the tables and dense tensors pushed by this try of the step's function (its
	// pushes may run concurrently).
	pushMu              sync.Mutex
	pushed, pushedDense []string
}

// ErrPushedTwice is returned by a Batch's Push (PushDense) when the step's function already
// pushed that table (tensor) for the batch: a server applies a batch to a slot at most once,
// so the second push's rows on the slots the first one reached would be dropped. Push all of a
// table's gradients of a batch in one call.
var ErrPushedTwice = errors.New("elastic: a table pushed twice for one batch")

// Worker is the name of the worker training the batch.
func (b *Batch) Worker() string { return b.s.cfg.Worker }

// Position is the batch's data position: servers apply a push of it at most once per slot.
func (b *Batch) Position() ps.Position {
	return ps.Position{Epoch: uint32(b.Epoch), Shard: uint32(b.Shard.Index), Start: b.Start, End: b.End}
}

// Pull reads rows of an embedding table into dst (ps.Client.Pull, with its options).
func (b *Batch) Pull(ctx context.Context, table string, ids []uint64, dst []float32, opts ...ps.PullOption) error {
	return b.s.cfg.Client.Pull(ctx, table, ids, dst, opts...)
}

// PullDense reads a dense tensor into dst (ps.Client.PullDense).
func (b *Batch) PullDense(ctx context.Context, name string, dst []float32) error {
	return b.s.cfg.Client.PullDense(ctx, name, dst)
}

// Push applies gradients to rows of an embedding table (ps.Client.Push at the batch's position).
// Each table is pushed once per batch (ErrPushedTwice); the session runs a failed function
// again from the start, and that try may push every table again.
func (b *Batch) Push(ctx context.Context, table string, ids []uint64, grads []float32) error {
	if !b.first(&b.pushed, table) {
		return fmt.Errorf("%w: %q", ErrPushedTwice, table)
	}
	return b.s.cfg.Client.Push(ctx, table, ids, grads, b.Step, ps.At(b.Position()))
}

// PushDense applies gradients to a dense tensor (ps.Client.PushDense at the batch's position).
// Each tensor is pushed once per batch, as with Push.
func (b *Batch) PushDense(ctx context.Context, name string, grads []float32) error {
	if !b.first(&b.pushedDense, name) {
		return fmt.Errorf("%w: dense tensor %q", ErrPushedTwice, name)
	}
	return b.s.cfg.Client.PushDense(ctx, name, grads, b.Step, ps.At(b.Position()))
}

// first records name in *pushed and reports whether it was not there yet.
func (b *Batch) first(pushed *[]string, name string) bool {
	b.pushMu.Lock()
	defer b.pushMu.Unlock()
	if slices.Contains(*pushed, name) {
		return false
	}
	*pushed = append(*pushed, name)
	return true
}

// ErrBatchFailed wraps the error of a batch whose function failed on every try: the session
// handed its shards back (the batch is replayed by whoever takes them, and the servers skip what
// this worker applied) and is finished.
var ErrBatchFailed = errors.New("elastic: batch failed")

// Step trains one batch: it reads the next batch (io.EOF when the data is exhausted), waits while
// a checkpoint barrier is up, runs fn, reports the batch and counts the step. Once the batch is
// begun, ctx's cancellation no longer stops it (see ApplyTimeout): Step returns ctx's error only
// before. A failed fn is run again (Retries); one that keeps failing ends the session with
// ErrBatchFailed. ErrStopped means the coordinator ended training.
func (s *Session) Step(ctx context.Context, fn func(ctx context.Context, b *Batch) error) error {
	for {
		err := s.step(ctx, fn)
		if !errors.Is(err, errRejoined) {
			return err
		}
	}
}

// errRejoined says the coordinator had dropped the worker (failed it, or rolled the job back):
// the batch in hand was given up, and the worker joined again with a new reader.
var errRejoined = errors.New("elastic: joined again")

func (s *Session) step(ctx context.Context, fn func(ctx context.Context, b *Batch) error) error {
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.join(ctx, false); err != nil {
		return err
	}
	s.mu.Lock()
	reader := s.reader
	s.mu.Unlock()
	sb, err := reader.Next(ctx)
	if err != nil {
		return err
	}
	epoch, err := s.begin(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.steps++
	b := &Batch{Batch: sb, Step: s.steps, s: s}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ApplyTimeout)
	defer cancel()
	backoff := s.cfg.RetryBackoff
	for tries := 0; ; {
		b.pushMu.Lock()
		b.pushed, b.pushedDense = b.pushed[:0], b.pushedDense[:0]
		b.pushMu.Unlock()
		err = fn(ctx, b)
		if err == nil || ctx.Err() != nil || errors.Is(err, ps.ErrFenced) {
			break
		}
		if !waitingForServer(err) {
			if tries++; tries > s.cfg.Retries {
				break
			}
		}
		s.log.Warn("batch failed; trying again", "tries", tries, "err", err)
		s.suspect(ctx, err)
		_ = wait.Sleep(ctx, backoff) // an ended ctx ends the loop at its next try
		if waitingForServer(err) {
			// A recovery ends at a moment nobody tells the worker: look often, so that
			// training goes on soon after it (a call to a server that is down fails fast).
			backoff = min(2*backoff, maxServerWait)
		} else {
			backoff = min(2*backoff, maxRetryBackoff)
		}
	}
	lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	defer lcancel()
	if errors.Is(err, ps.ErrFenced) {
		// The coordinator fenced this worker (it failed it, or rolled the job back): what it
		// did not apply of the batch is replayed by whoever holds the shard now.
		s.cfg.Control.End(lctx, s.cfg.Worker, epoch, false)
		s.log.Warn("fenced in the middle of a batch; joining again", "err", err)
		if err := s.rejoin(lctx); err != nil {
			return err
		}
		return errRejoined
	}
	if err == nil {
		err = reader.Done(ctx, sb)
		if err == nil {
			return s.cfg.Control.End(ctx, s.cfg.Worker, epoch, true)
		}
	}
	// The batch may be partly applied and is not reported: hand the shards back so it is
	// replayed from the last reported offset, and stop.
	s.cfg.Control.End(lctx, s.cfg.Worker, epoch, false)
	s.finish(lctx, fmt.Errorf("%w: %w", ErrBatchFailed, err))
	return s.usable()
}

// suspect tells the coordinator of a server the batch could not reach, so that it looks at
// once (Coordinator.Suspect). A client whose resolver is the coordinator has told it already
// (ps.UnreachableReporter), and the coordinator folds the two reports into one probe; this one
// is for clients that resolve servers on their own (a static server list).
func (s *Session) suspect(ctx context.Context, err error) {
	r, ok := s.cfg.Control.(suspecter)
	se, down := ps.Unreachable(err)
	if !ok || !down {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, suspectTimeout)
	defer cancel()
	if err := r.Suspect(sctx, se.Server, se.Err.Error()); err != nil {
		s.log.Debug("reporting an unreachable server", "server", se.Server, "err", err)
	}
}

// suspectTimeout bounds a session's report of an unreachable server.
const suspectTimeout = time.Second

// maxRetryBackoff caps the wait between two tries of a batch; maxServerWait between two tries
// of one that failed for want of a parameter server.
const (
	maxRetryBackoff = time.Second
	maxServerWait   = 100 * time.Millisecond
)

// waitingForServer reports whether a batch failed for want of a parameter server (down, or
// not serving its slots yet): it goes through once the coordinator has recovered the server.
func waitingForServer(err error) bool {
	var se *ps.ServerError
	return errors.As(err, &se) || errors.Is(err, ps.ErrWrongOwner)
}

// begin waits at the barrier. A worker the coordinator dropped gives up the batch in hand and
// joins again (errRejoined).
func (s *Session) begin(ctx context.Context) (uint64, error) {
	s.mu.Lock()
	epoch := s.epoch
	s.mu.Unlock()
	err := s.cfg.Control.Begin(ctx, s.cfg.Worker, epoch)
	switch {
	case err == nil:
		return epoch, nil
	case errors.Is(err, ErrNotMember):
		s.log.Warn("dropped by the coordinator; joining again")
		if err := s.rejoin(ctx); err != nil {
			return 0, err
		}
		return 0, errRejoined
	}
	return 0, err
}

// rejoin joins again with a new reader: the leases of the old one were handed back (the worker
// was failed) or voided (the job was rolled back), and what it read ahead is not this worker's.
func (s *Session) rejoin(ctx context.Context) error {
	r, err := shard.NewReader(s.rc)
	if err != nil {
		return err
	}
	s.mu.Lock()
	old := s.reader
	s.reader = r
	s.mu.Unlock()
	// Hand back what the old reader still holds: leases it took after the worker was dropped
	// (from a coordinator that took the job over, say) would otherwise wait out their TTL.
	// The new reader has taken none yet.
	lctx, cancel := context.WithTimeout(ctx, leaveTimeout)
	if err := old.Leave(lctx); err != nil {
		s.log.Warn("handing the old reader's shards back", "err", err)
	}
	cancel()
	old.Close()
	return s.join(ctx, true)
}

// Join registers the worker with the coordinator now (Step does it otherwise): a program that
// must not touch the servers before the job is ready (restored) joins first.
func (s *Session) Join(ctx context.Context) error {
	if err := s.usable(); err != nil {
		return err
	}
	return s.join(ctx, false)
}

// join registers with the coordinator (again, with again) and sets the client's epoch.
func (s *Session) join(ctx context.Context, again bool) error {
	s.mu.Lock()
	if s.epoch != 0 && !again {
		s.mu.Unlock()
		return nil
	}
	epoch, err := s.cfg.Control.Join(ctx, s.cfg.Worker, s.reader.BatchSize())
	if err != nil {
		s.mu.Unlock()
		return err
	}
	first := s.epoch == 0
	s.epoch = epoch
	s.cfg.Client.SetEpoch(epoch)
	s.mu.Unlock()
	if first {
		s.warmUp(ctx)
	}
	return nil
}

// warmUp fetches the owner table and connects to every server before the worker takes its
// first shard, so that its first batch does not hold a lease while it does. It is best effort:
// a server that does not answer is the first batch's business.
func (s *Session) warmUp(ctx context.Context) {
	t, err := s.cfg.Client.OwnerTable(ctx)
	if err != nil {
		s.log.Debug("warm-up: no owner table", "err", err)
		return
	}
	var wg sync.WaitGroup
	for _, n := range t.Nodes {
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, warmUpTimeout)
			defer cancel()
			if _, err := s.cfg.Client.Stats(wctx, n.Addr, false); err != nil {
				s.log.Debug("warm-up: server does not answer", "server", n.ID, "err", err)
			}
		})
	}
	wg.Wait()
}

// warmUpTimeout bounds the warm-up's call to each server.
const warmUpTimeout = 2 * time.Second

func (s *Session) usable() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.failed != nil:
		return s.failed
	case s.closed:
		return ErrClosed
	}
	return nil
}

// leaveTimeout bounds a session's goodbyes (its last report, handing its shards back, leaving
// the job) when the coordinator cannot be reached: its leases expire and it is failed anyway.
const leaveTimeout = 10 * time.Second

// finish hands the shards back, leaves the job and records why.
func (s *Session) finish(ctx context.Context, why error) {
	s.mu.Lock()
	reader := s.reader
	s.mu.Unlock()
	if err := reader.Leave(ctx); err != nil {
		s.log.Warn("handing shards back", "err", err)
	}
	s.mu.Lock()
	epoch := s.epoch
	if s.failed == nil {
		s.failed = why
	}
	s.mu.Unlock()
	if epoch != 0 {
		if err := s.cfg.Control.Leave(ctx, s.cfg.Worker, epoch); err != nil {
			s.log.Warn("leaving", "err", err)
		}
	}
}

// Worker returns the worker's name.
func (s *Session) Worker() string { return s.cfg.Worker }

// Steps returns the number of batches this session began.
func (s *Session) Steps() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.steps
}

// Close hands the worker's shards back to the dispatcher (progress reported so far is kept),
// leaves the job and closes the reader. Idempotent.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	failed := s.failed
	s.mu.Unlock()
	if failed == nil {
		ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
		s.finish(ctx, ErrClosed)
		cancel()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reader.Close()
}
