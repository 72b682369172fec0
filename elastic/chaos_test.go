package elastic_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var chaosSeed = flag.Uint64("chaos.seed", 0, "seed of TestChaos's schedule of failures (0: a new one each run)")

// The chaos test's job: 3 servers, 4 workers, the fault tests' model (faultData, trainStep,
// faultExpected: two epochs of 3072 records, 192 batches of 32).
const (
	chaosServers = 3
	chaosWorkers = 4
	chaosBatch   = 32
	// The failures fall between these counts of batches begun (the job begins at least 192).
	chaosFirst, chaosLast = 8, 150
)

// A seeded schedule of failures strikes a job of 1 coordinator, 3 servers and 4 workers while
// it trains two epochs with a checkpoint every 5 steps: workers die (between batches, or halfway
// through a push that reaches only some slots) and come back under the same or a new name,
// one server at a time dies and comes back as a new incarnation (at once, or once the
// coordinator has found it failed), and the coordinator dies and a new one takes the job over.
// At the end no worker has failed but those killed, every position was trained exactly once
// per epoch, and under Rollback every row equals the failure-free result bit for bit; under
// Partial it equals it but for the updates that the recoveries reported lost, on the failed
// servers' slots. A server dies at any time, so the commit a Partial recovery restores may
// hold batches applied and not yet reported (after a takeover, or a worker that died halfway
// through a batch), which the recovery reports held, not lost. The seed is logged;
// -chaos.seed=N runs a schedule again.
func TestChaos(t *testing.T) {
	seed := *chaosSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.Logf("seed %d (run it again with -chaos.seed=%d)", seed, seed)
	t.Run("Rollback", func(t *testing.T) { testChaos(t, elastic.Rollback, seed) })
	t.Run("Partial", func(t *testing.T) { testChaos(t, elastic.Partial, seed) })
}

// chaosKind is a kind of failure.
type chaosKind uint8

const (
	killWorker chaosKind = iota
	killServer
	restartCoordinator
)

// chaosEvent is one failure of the schedule.
type chaosEvent struct {
	at     int64 // strikes once this many batches were begun
	kind   chaosKind
	target int // the worker (its slot) or the server
	// A worker: it dies halfway through the push of its next batch, which reaches only the
	// slots in mask (midBatch), or between two batches; its replacement takes a new name
	// (rename) or the same.
	midBatch bool
	mask     uint64
	rename   bool
	// A server: it comes back once the coordinator has found it failed (wait), or at once.
	wait bool
}

func (e chaosEvent) String() string {
	switch e.kind {
	case killWorker:
		how := "between batches"
		if e.midBatch {
			how = fmt.Sprintf("halfway through a push (to slots %016x)", e.mask)
		}
		return fmt.Sprintf("at %d: kill worker %d %s, rename=%t", e.at, e.target, how, e.rename)
	case killServer:
		return fmt.Sprintf("at %d: kill server ps-%d, restart after detection=%t", e.at, e.target, e.wait)
	}
	return fmt.Sprintf("at %d: restart the coordinator", e.at)
}

// chaosSchedule draws three kills of a worker, three of a server and two restarts of the
// coordinator, at distinct batch counts.
func chaosSchedule(rng *rand.Rand) []chaosEvent {
	kinds := []chaosKind{killWorker, killWorker, killWorker, killServer, killServer, killServer, restartCoordinator, restartCoordinator}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	var ats []int64
	for len(ats) < len(kinds) {
		if at := chaosFirst + rng.Int64N(chaosLast-chaosFirst); !slices.Contains(ats, at) {
			ats = append(ats, at)
		}
	}
	slices.Sort(ats)
	events := make([]chaosEvent, len(kinds))
	for i, k := range kinds {
		e := chaosEvent{at: ats[i], kind: k}
		switch k {
		case killWorker:
			e.target, e.midBatch, e.mask, e.rename = rng.IntN(chaosWorkers), rng.IntN(2) == 0, rng.Uint64(), rng.IntN(2) == 0
		case killServer:
			e.target, e.wait = rng.IntN(chaosServers), rng.IntN(2) == 0
			rng.Int64N(12) // drawn as before, so that a seed still names the same schedule
		}
		events[i] = e
	}
	return events
}

// chaosLoss is a Partial recovery's lost updates: those of ev.Lost on the failed server's slots.
type chaosLoss struct {
	ev    elastic.RecoveryEvent
	slots *embedding.SlotSet
}

func testChaos(t *testing.T, policy elastic.RecoveryPolicy, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(policy)))
	events := chaosSchedule(rng)
	for _, e := range events {
		t.Logf("scheduled %s", e)
	}
	recovered := make(chan elastic.RecoveryEvent, 64)
	job := localFaultJob(t, chaosServers, checkpoint.NewMemStorage(), func(c *elastic.Config) {
		c.Recovery = policy
		c.CheckpointEvery = 5
		c.HealthEvery = 20 * time.Millisecond
		c.ServerTimeout = 200 * time.Millisecond
		c.ReplaceWait = time.Minute // every killed server comes back
		c.WorkerSilence = 400 * time.Millisecond
		c.ArriveTimeout = time.Second
		c.OnRecovery = func(ev elastic.RecoveryEvent) {
			if ev.Err == nil {
				recovered <- ev
			}
		}
		// Shards are lost by workers the test kills (and, on a loaded machine, by healthy
		// ones failed for silence), not for bad data: the dispatcher never gives one up.
		c.Dispatcher.MaxFailures = 1 << 16
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h := newChaosHarness(ctx, t, job)
	defer h.stop()

	var losses []chaosLoss
	renames := 0
	for _, e := range events {
		if h.waitBatches(e.at) {
			t.Logf("%s: the workers are done already", e)
		}
		t.Logf("%s (%d batches begun)", e, h.batches.load())
		switch e.kind {
		case killWorker:
			w := h.slots[e.target]
			if e.midBatch {
				w.crash.Store(&e.mask)
			} else {
				w.cancel()
			}
			select {
			case <-w.done:
			case <-ctx.Done():
				t.Fatalf("worker %s did not die", w.name)
			}
			w.killed = true
			name := w.name
			if e.rename {
				renames++
				name = fmt.Sprintf("w%d.%d", e.target, renames)
			}
			h.slots[e.target] = h.start(name)

		case killServer:
			id := elastic.ServerID(e.target)
			c := job.Coordinator()
			table, err := c.OwnerTable(ctx, 0)
			require.NoError(t, err)
			before := c.Status().ServerFailures
			if policy == elastic.Partial {
				// A batch pushed before the failure and reported after the recovery would be
				// lost uncounted (the package doc says so): the server dies when no batch is
				// between its first push and its report.
				h.gate.close()
			}
			require.NoError(t, job.KillServer(e.target))
			h.gate.open()
			if e.wait {
				tick := time.NewTicker(5 * time.Millisecond)
				for c.Status().ServerFailures == before {
					select {
					case <-tick.C:
					case <-ctx.Done():
						t.Fatalf("the coordinator did not find %s failed", id)
					}
				}
				tick.Stop()
			}
			require.NoError(t, job.RestartServer(ctx, e.target))
			var ev elastic.RecoveryEvent
			select {
			case ev = <-recovered:
			case <-ctx.Done():
				t.Fatalf("%s was not recovered", id)
			}
			t.Logf("recovered %v from commit %d in %v, %d records lost, %d batches held", ev.Failed, ev.Step, ev.Duration.Round(time.Millisecond), ev.LostRecords, len(ev.Held))
			require.Contains(t, ev.Failed, id)
			require.Len(t, ev.Failed, 1, "one server at a time")
			require.Equal(t, []string{id}, ev.Replaced, "its new incarnation took its slots")
			if policy == elastic.Rollback {
				require.Zero(t, ev.LostRecords, "a rollback loses nothing")
				continue
			}
			losses = append(losses, chaosLoss{ev: ev, slots: table.SlotsOf(id)})

		case restartCoordinator:
			step, err := job.RestartCoordinator(ctx)
			require.NoError(t, err)
			t.Logf("a new coordinator took over from commit %d", step)
			// A takeover replays the batches trained since the commit it restores, onto every
			// server that lacks them: the updates a Partial recovery from that same commit
			// lost land now.
			losses = slices.DeleteFunc(losses, func(l chaosLoss) bool { return l.ev.Step >= step })
		}
	}

	h.wait()
	for h.startAgain() {
		h.wait()
	}
	select {
	case ev := <-recovered:
		t.Fatalf("a recovery nobody caused: %+v", ev)
	default:
	}
	c := job.Coordinator()
	_, err := c.Checkpoint(ctx)
	require.NoError(t, err)
	checks := c.ExactlyOnce()
	require.Len(t, checks, faultEpochs)
	for _, e := range checks {
		assert.True(t, e.OK(), "%s", e)
		assert.True(t, e.Complete, "%s", e)
		assert.Zero(t, e.Failed, "%s", e)
	}

	want := faultExpected()
	if policy == elastic.Rollback {
		assert.Equal(t, want, localRows(job), "every row holds every record once per epoch")
		return
	}
	// Under Partial, every record once per epoch, but on each failed server's slots the
	// updates of the positions its recovery reported lost. A position lost twice on the same
	// slots (two recoveries from one commit) was lost once.
	type pos struct {
		epoch int
		p     int64
	}
	lost := map[pos]bool{}
	for _, l := range losses {
		var n int64
		for _, sp := range l.ev.Lost {
			n += sp.To - sp.From
			for p := sp.From; p < sp.To; p++ {
				if l.slots.Has(embedding.Slot(faultID(p), faultSlots)) {
					lost[pos{sp.Epoch, p}] = true
				}
			}
		}
		assert.Equal(t, l.ev.LostRecords, n, "LostRecords counts Lost")
		// A batch the commit held: lost only on the failed slots its pushes before the
		// commit did not reach (a worker that died halfway through them).
		for _, h := range l.ev.Held {
			for p := h.From; p < h.To; p++ {
				sl := embedding.Slot(faultID(p), faultSlots)
				if _, in := slices.BinarySearch(h.Slots, sl); l.slots.Has(sl) && !in {
					lost[pos{h.Epoch, p}] = true
				}
			}
		}
	}
	g := make([]float32, faultDim)
	for k := range lost {
		faultGrad(k.p, g)
		row := want[faultID(k.p)]
		for i := range g {
			row[i] += g[i] // the update that was lost
		}
	}
	t.Logf("%d updates lost, in %d recoveries still in effect", len(lost), len(losses))
	assert.Equal(t, want, localRows(job), "every row holds every record once per epoch, but the lost ones on the failed slots")
}

// chaosHarness runs the workers of the chaos test: one goroutine for each, each training
// with its own Session until the data is done or the test kills it.
type chaosHarness struct {
	t       *testing.T
	job     *local.Job
	ctx     context.Context
	batches chaosCounter // batches begun, by every worker
	gate    chaosGate    // held from a batch's step function until its Step returns
	slots   []*chaosWorker
	all     []*chaosWorker // every worker started
	again   int            // times the workers were started again
}

// newChaosHarness starts the workers w0..w3; ctx bounds the test.
func newChaosHarness(ctx context.Context, t *testing.T, job *local.Job) *chaosHarness {
	h := &chaosHarness{t: t, job: job, ctx: ctx}
	h.gate.cond.L = &h.gate.mu
	h.batches.ch = make(chan struct{})
	for i := range chaosWorkers {
		h.slots = append(h.slots, h.start(fmt.Sprintf("w%d", i)))
	}
	return h
}

// chaosWorker is one worker process.
type chaosWorker struct {
	name   string
	cancel context.CancelFunc
	// crash, when set, makes the worker die halfway through its next batch: it pushes the
	// batch's updates of the slots in *crash, and its goroutine ends.
	crash  atomic.Pointer[uint64]
	done   chan struct{}  // closed when its goroutine has ended
	err    error          // why it stopped training, read after done
	killed bool           // the test killed it (the test's goroutine only)
	held   *elastic.Batch // the batch for which it holds the gate (its goroutine only)
}

// start starts a worker: a new Session named name, training in its own goroutine.
func (h *chaosHarness) start(name string) *chaosWorker {
	sess, err := h.job.NewSession(name, shard.ReaderConfig{Source: faultData, BatchSize: chaosBatch})
	require.NoError(h.t, err)
	ctx, cancel := context.WithCancel(h.ctx)
	w := &chaosWorker{name: name, cancel: cancel, done: make(chan struct{})}
	h.all = append(h.all, w)
	go func() {
		defer close(w.done)
		defer cancel()
		defer w.release(h) // also when it dies halfway (runtime.Goexit)
		for {
			err := sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error { return w.train(ctx, h, b) })
			w.release(h)
			switch {
			case err == nil:
			case errors.Is(err, io.EOF), errors.Is(err, elastic.ErrStopped):
				w.err = sess.Close()
				return
			default:
				// Killed between batches (ctx), or a failure the test reports. A dead
				// worker says no goodbye: its Session is abandoned, not closed.
				w.err = err
				return
			}
		}
	}()
	return w
}

// train is the worker's step function; the worker holds the gate from here (before the
// batch's first push) until its Step returns (after its report).
func (w *chaosWorker) train(ctx context.Context, h *chaosHarness, b *elastic.Batch) error {
	if w.held != b { // a new batch, not a retry of the one in hand
		w.release(h)
		h.gate.enter()
		w.held = b
		h.batches.add()
	}
	if mask := w.crash.Load(); mask != nil {
		pushSlots(ctx, b, *mask) // its error does not matter: the worker is dead
		runtime.Goexit()
	}
	return trainStep(ctx, b)
}

func (w *chaosWorker) release(h *chaosHarness) {
	if w.held != nil {
		h.gate.exit()
		w.held = nil
	}
}

// pushSlots pushes the batch's updates of the slots in mask only, as a worker that died in the
// middle of its push leaves them: each server it reached applied its part of the push.
func pushSlots(ctx context.Context, b *elastic.Batch, mask uint64) error {
	var ids []uint64
	var grads []float32
	g := make([]float32, faultDim)
	for k, id := range b.IDs {
		if mask&(1<<embedding.Slot(id, faultSlots)) == 0 {
			continue
		}
		faultGrad(recordIndex(b, k), g)
		ids, grads = append(ids, id), append(grads, g...)
	}
	if len(ids) == 0 {
		return nil
	}
	return b.Push(ctx, "emb", ids, grads)
}

// wait waits until every worker has stopped, and checks that none failed but those killed.
func (h *chaosHarness) wait() {
	for _, w := range h.all {
		select {
		case <-w.done:
		case <-h.ctx.Done():
			h.t.Fatalf("worker %s did not finish", w.name)
		}
	}
	var failed []string
	for _, w := range h.all {
		if !w.killed && w.err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", w.name, w.err))
		}
	}
	require.Empty(h.t, failed, "no worker failed:\n%s", strings.Join(failed, "\n"))
}

// stop kills every worker still running and waits for them (at the end of a failed test).
func (h *chaosHarness) stop() {
	h.gate.open()
	for _, w := range h.all {
		w.cancel()
	}
	for _, w := range h.all {
		<-w.done
	}
}

// startAgain starts the workers again when every one has left and the data is not done (a
// takeover after they ran out of data returned the dispatcher to its commit), as a scaler
// would start them; it reports whether it did.
func (h *chaosHarness) startAgain() bool {
	for _, w := range h.slots {
		select {
		case <-w.done:
		default:
			return false
		}
	}
	if h.job.Coordinator().Dispatcher().Progress().Finished {
		return false
	}
	h.again++
	require.LessOrEqual(h.t, h.again, 5, "the workers start again a few times at most")
	h.t.Logf("the data is not done, and the workers have left: starting them again")
	for i := range h.slots {
		h.slots[i] = h.start(fmt.Sprintf("w%d.again%d", i, h.again))
	}
	return true
}

// waitBatches waits until n batches were begun, and reports whether the workers were all done
// first. It fails the test when the test's context ends.
func (h *chaosHarness) waitBatches(n int64) (done bool) {
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	slots := slices.Clone(h.slots)
	finished := make(chan struct{})
	go func() {
		for _, w := range slots {
			select {
			case <-w.done:
			case <-ctx.Done():
				return
			}
		}
		close(finished)
		cancel()
	}()
	err := h.batches.wait(ctx, n)
	require.NoError(h.t, h.ctx.Err(), "waiting for %d batches (%d begun)", n, h.batches.load())
	select {
	case <-finished:
		return err != nil
	default:
		return false
	}
}

// chaosCounter counts, and lets the test wait for a count.
type chaosCounter struct {
	mu sync.Mutex
	n  int64
	ch chan struct{} // closed and replaced at every count
}

func (c *chaosCounter) add() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	close(c.ch)
	c.ch = make(chan struct{})
}

func (c *chaosCounter) load() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// wait waits until the count reaches n.
func (c *chaosCounter) wait(ctx context.Context, n int64) error {
	for {
		c.mu.Lock()
		done, ch := c.n >= n, c.ch
		c.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// chaosGate lets the test wait until no worker is between a batch's first push and the end of
// its Step, and hold them there.
type chaosGate struct {
	mu     sync.Mutex
	cond   sync.Cond
	n      int // workers inside
	closed bool
}

func (g *chaosGate) enter() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.closed {
		g.cond.Wait()
	}
	g.n++
}

func (g *chaosGate) exit() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	g.cond.Broadcast()
}

// close lets no worker in, and waits until every one inside has left.
func (g *chaosGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	for g.n > 0 {
		g.cond.Wait()
	}
}

func (g *chaosGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = false
	g.cond.Broadcast()
}
