package elastic

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// The barrier core: who trains, under which fence epoch, and when the job pauses for a
// checkpoint. It does no I/O and has no clock or lock of its own: every event carries the
// time, and every transition returns the actions the driver must carry out, in order. The
// Coordinator wraps it with a mutex and executes the actions (fence on the servers, evict from
// the dispatcher, snapshot, release, commit).
//
// A checkpoint goes through three phases:
//
//	idle       -> barrier up (gen becomes odd): workers finish the batch in hand and arrive
//	pausing    -> every live worker arrived (or was failed after ArriveTimeout): ActSnapshot
//	snapshot   -> snapshotDone: ActRelease (gen becomes even), and ActCommit if it succeeded
//
// A hold (requestHold: the program wants the model still, to digest it) raises the same barrier
// when no checkpoint is due, and ends in phase held instead of snapshot: ActHold, then holdDone
// releases it. Training time paused for a hold counts as paused, as a checkpoint's does.
//
// A worker is live from join until leave or failure. A failed worker is fenced (ActFence of its
// epoch, which the driver applies on every server before anything later in the action list)
// and evicted from the dispatcher, so its shards go back at the last reported offset; a worker
// that joins again gets a new epoch and, if a barrier is up, must arrive before it trains.

// phase is where the core is in the checkpoint cycle.
type phase uint8

const (
	phaseIdle phase = iota
	phasePausing
	phaseSnapshot
	phaseHeld
)

// actionKind says what the driver must do.
type actionKind uint8

const (
	// actFence: refuse pushes of Epochs on every server; done before any later action.
	actFence actionKind = iota + 1
	// actEvict: hand Worker's shards back to the dispatcher at their reported offsets: those
	// it held when it was failed (the driver notes the dispatcher's Granted then), not those
	// it took after joining again while the action waited.
	actEvict
	// actPause: stop the dispatcher's clock (a barrier went up).
	actPause
	// actSnapshot: snapshot every server, the dispatcher and the job state at Step.
	actSnapshot
	// actRelease: let the workers go on (barrier Gen is down) and restart the dispatcher's clock.
	actRelease
	// actCommit: persist and commit the snapshot of Step in the background, in step order.
	actCommit
	// actRecover: recover the failed parameter servers (Worker names the first one): call
	// recoveryStep until the recovery is over.
	actRecover
	// actAbandon: never commit the snapshots of Steps (a server failed before their commit).
	actAbandon
	// actProbe: ask the nodes of the failed Servers for their health, and hand the answers to
	// the next recoveryStep.
	actProbe
	// actRestore: restore as Plan says, then report it (restoreDone).
	actRestore
	// actHold: every live worker waits at barrier Gen with no batch in hand: serve the first
	// Holds hold requests (the model is still), then report it (holdDone).
	actHold
)

// action is one instruction from the core to its driver.
type action struct {
	kind    actionKind
	epochs  []uint64 // actFence
	worker  string   // actEvict
	granted uint64   // actEvict: the dispatcher's newest lease when it was decided
	step    uint64   // actSnapshot, actCommit
	gen     uint64   // actSnapshot, actRelease
	steps   []uint64 // actAbandon
	servers []string // actProbe
	plan    *restorePlan
	reason  string // why (logged); actRestore: set when there is nothing to restore onto
	holds   int    // actHold: the hold requests it serves, the oldest first
	held    bool   // actPause, actRelease: the barrier is a hold's, not a checkpoint's
}

// member is one live worker as the core knows it.
type member struct {
	id      string
	epoch   uint64    // its fence epoch
	arrived uint64    // the barrier generation it arrived at (0: none)
	inBatch bool      // between begin and end of a batch (in-process workers report this)
	seen    time.Time // when it was last heard from
}

// coreConfig are the core's timings.
type coreConfig struct {
	// every is the number of steps between checkpoints; 0: none by steps.
	every uint64
	// interval is the time between checkpoints; 0: none by time. A checkpoint is due when either
	// is reached, counting from the last barrier (taken or failed) or the core's start.
	interval time.Duration
	// arriveTimeout bounds the wait at a barrier for a worker; one that has not arrived by then
	// is failed (fenced and evicted) and the snapshot proceeds without it.
	arriveTimeout time.Duration
	// silence is how long a worker may go unheard before it is failed; 0 or less: never.
	silence time.Duration
	// serverTimeout fails a server that has not answered for this long, and bounds a
	// recovery's wait for the commits under way; replaceWait bounds its wait for a new
	// incarnation of a failed server; probeEvery folds the reports of an unreachable server
	// into one probe. partial is the policy: Partial, or else Rollback.
	serverTimeout, replaceWait, probeEvery time.Duration
	partial                                bool
}

// core is the barrier and checkpoint-schedule state machine. Not safe for concurrent use.
type core struct {
	cfg coreConfig

	now         time.Time
	incarnation uint64 // this coordinator's incarnation: the high 32 bits of every epoch it issues
	lastEpoch   uint64 // the last fence epoch issued
	gen         uint64 // barrier generation: odd while a barrier is up
	phase       phase
	pauseAt     time.Time // when the barrier went up
	step        uint64    // batches applied and reported by every worker so far
	snapStep    uint64    // step of the last snapshot taken (or restored)
	tryStep     uint64    // step at which the last barrier went up: the schedule counts from it
	tryAt       time.Time // when the last barrier came down, or the core started or was restored
	want        bool      // a checkpoint was asked for (final, or by the program)
	stopped     bool      // no more checkpoints; arriving workers are told to stop
	// stopAtSnapshot stops training at the end of the next snapshot, before its barrier comes
	// down, so the final checkpoint holds every batch trained (a final request).
	stopAtSnapshot bool
	members        map[string]*member
	snapshots      []uint64 // snapshots taken and not yet committed, in step order
	committed      uint64   // step of the newest commit
	abandoned      []uint64 // snapshots awaiting their commit that a recovery abandoned
	servers        map[string]*server
	serverFailures int      // server failures noticed
	recovering     bool     // a parameter server failed and is not recovered yet: no barrier
	hold           bool     // and no worker may begin a batch meanwhile (Rollback)
	rec            recovery // while recovering
	// holds counts the hold requests no ActHold serves yet; holding says the barrier up is a
	// hold's.
	holds   int
	holding bool
}

// recovery is the state of a recovery under way.
type recovery struct {
	phase recPhase
	since time.Time // when the phase began
}

// newCore returns the core of a fresh job: incarnation 1.
func newCore(cfg coreConfig, now time.Time) *core {
	return &core{cfg: cfg, now: now, tryAt: now, members: map[string]*member{}, servers: map[string]*server{}, incarnation: 1, lastEpoch: 1 << 32}
}

// Fence epochs are incarnation<<32 | n: a coordinator restored from a commit runs as the next
// incarnation, so every epoch it issues is above every epoch any earlier coordinator issued,
// even those issued after the commit it restored, and the floor incarnation<<32 fences them all.
func epochString(e uint64) string { return fmt.Sprintf("%d.%d", e>>32, e&0xffffffff) }

// floor is the lowest epoch of this incarnation: servers refuse every push below it.
func (c *core) floor() uint64 { return c.incarnation << 32 }

// tick advances the time (never backwards).
func (c *core) tick(now time.Time) {
	if now.After(c.now) {
		c.now = now
	}
}

// barrierUp reports whether workers must arrive before their next batch.
func (c *core) barrierUp() bool { return c.gen%2 == 1 }

// join registers worker id (again) and returns its new fence epoch. A worker that was already
// a member lost touch with the coordinator: its old epoch is fenced first, so nothing it still
// sends under that epoch can land.
func (c *core) join(now time.Time, id string) (epoch uint64, acts []action) {
	c.tick(now)
	if old, ok := c.members[id]; ok {
		acts = append(acts, action{kind: actFence, epochs: []uint64{old.epoch}, reason: id + " joined again"})
	}
	c.lastEpoch++
	c.members[id] = &member{id: id, epoch: c.lastEpoch, seen: c.now}
	return c.lastEpoch, acts
}

// heard records a sign of life from worker id under epoch; false if it is not a member with
// that epoch (it was failed or replaced: it must join again).
func (c *core) heard(now time.Time, id string, epoch uint64) bool {
	c.tick(now)
	m, ok := c.members[id]
	if !ok || m.epoch != epoch {
		return false
	}
	m.seen = c.now
	return true
}

// alive records a sign of life from worker id, whatever its epoch (it talks to the dispatcher:
// waiting for shards at an epoch's end, say).
func (c *core) alive(now time.Time, id string) {
	c.tick(now)
	if m, ok := c.members[id]; ok {
		m.seen = c.now
	}
}

// begin records that worker id starts applying a batch. It fails (false) when a barrier is up
// (the worker counts as arrived and must wait for the release), after stop, or when the worker
// is not a member under epoch (it must join again).
func (c *core) begin(now time.Time, id string, epoch uint64) bool {
	if !c.heard(now, id, epoch) || c.stopped {
		return false
	}
	m := c.members[id]
	if c.recovering && c.hold {
		return false // held until the job is restored
	}
	if c.barrierUp() {
		// A worker asking to begin holds no batch: it has arrived, and waits for the release.
		m.arrived, m.inBatch = c.gen, false
		return false
	}
	m.inBatch = true
	return true
}

// end records that worker id finished a batch (applied and reported: ok) or gave it up. ok
// counts one step; counted says whether it did (the worker began a batch as a member).
func (c *core) end(now time.Time, id string, epoch uint64, ok bool) (counted bool, acts []action) {
	if !c.heard(now, id, epoch) || !c.members[id].inBatch {
		return false, nil // not a member, or no batch begun: nothing to count
	}
	c.members[id].inBatch = false
	if ok {
		c.step++
	}
	return ok, c.advance()
}

// arrive records that worker id holds no batch and waits at barrier gen. A stale generation
// (a barrier already released, or a late call) changes nothing.
func (c *core) arrive(now time.Time, id string, epoch, gen uint64) []action {
	if !c.heard(now, id, epoch) {
		return nil
	}
	m := c.members[id]
	if gen != c.gen || !c.barrierUp() {
		return nil
	}
	m.arrived, m.inBatch = gen, false
	return c.advance()
}

// leave forgets worker id, which stopped cleanly. Its epoch is fenced anyway: nothing it sent
// may land later.
func (c *core) leave(now time.Time, id string, epoch uint64) []action {
	c.tick(now)
	m, ok := c.members[id]
	if !ok || m.epoch != epoch {
		return nil
	}
	delete(c.members, id)
	acts := []action{{kind: actFence, epochs: []uint64{m.epoch}, reason: id + " left"}}
	return append(acts, c.advance()...)
}

// fail removes worker id (crashed, cut off, or its batch failed): fence its epoch, evict its
// leases.
func (c *core) fail(now time.Time, id string, reason string) []action {
	c.tick(now)
	return append(c.failLocked(id, reason), c.advance()...)
}

func (c *core) failLocked(id, reason string) []action {
	m, ok := c.members[id]
	if !ok {
		return nil
	}
	delete(c.members, id)
	return []action{
		{kind: actFence, epochs: []uint64{m.epoch}, reason: id + ": " + reason},
		{kind: actEvict, worker: id, reason: reason},
	}
}

// gossipFailed fails worker id, which gossip declared failed, unless it was heard from within
// quiet: a worker still calling is alive, whatever gossip says (say, a new process under the
// same id that joined before its predecessor's failure was gossiped).
func (c *core) gossipFailed(now time.Time, id string, quiet time.Duration) []action {
	c.tick(now)
	m, ok := c.members[id]
	if !ok || c.now.Sub(m.seen) < quiet {
		return nil
	}
	acts := c.failLocked(id, fmt.Sprintf("gossip: failed, and silent for %v", c.now.Sub(m.seen).Round(time.Millisecond)))
	return append(acts, c.advance()...)
}

// request asks for a checkpoint at the next chance (the final one, or the program's); with
// final, training stops at the end of that snapshot.
func (c *core) request(now time.Time, final bool) []action {
	c.tick(now)
	c.want = true
	c.stopAtSnapshot = c.stopAtSnapshot || final
	return c.advance()
}

// stop ends the checkpoint schedule: no barrier goes up after the ones in progress, and no
// batch begins.
func (c *core) stop() { c.stopped = true }

// inFlight reports whether a live worker holds a batch it began.
func (c *core) inFlight() bool {
	for _, m := range c.members {
		if m.inBatch {
			return true
		}
	}
	return false
}

// timers fails the workers that went silent and those a barrier has waited for too long.
func (c *core) timers(now time.Time) []action {
	c.tick(now)
	var acts []action
	for _, id := range c.sortedMembers() {
		m := c.members[id]
		// Held by us (or stuck retrying pushes to a failed server), so not silent.
		waiting := c.recovering || c.barrierUp() && m.arrived == c.gen
		switch {
		case c.cfg.silence > 0 && !waiting && c.now.Sub(m.seen) > c.cfg.silence:
			acts = append(acts, c.failLocked(id, fmt.Sprintf("silent for %v", c.now.Sub(m.seen).Round(time.Millisecond)))...)
		case c.phase == phasePausing && c.cfg.arriveTimeout > 0 && m.arrived != c.gen && c.now.Sub(c.pauseAt) > c.cfg.arriveTimeout:
			acts = append(acts, c.failLocked(id, fmt.Sprintf("did not reach barrier %d in %v", c.gen, c.cfg.arriveTimeout))...)
		}
	}
	return append(acts, c.advance()...)
}

// advance raises a barrier when a checkpoint is due, or else a hold is asked for, and starts
// the snapshot (or the hold) once every live worker has arrived.
func (c *core) advance() []action {
	var acts []action
	// The schedule counts from the last barrier, taken or failed, so a failing snapshot is
	// retried a whole interval later, not at every step. Time due without a step trained since
	// the last snapshot raises none: it would hold what that one holds.
	// After a stop only a request raises one (a final checkpoint tried again).
	switch {
	case c.phase != phaseIdle || c.recovering:
	case (!c.stopped || c.want) && c.step > c.snapStep && (c.want || c.stepsDue() || c.timeDue()):
		c.gen++
		c.tryStep, c.tryAt = c.step, c.now
		c.phase, c.pauseAt = phasePausing, c.now
		reason := "schedule"
		if c.want {
			reason = "requested"
		}
		acts = append(acts, action{kind: actPause, gen: c.gen, step: c.step, reason: reason})
	case c.holds > 0:
		c.gen++
		c.phase, c.pauseAt, c.holding = phasePausing, c.now, true
		acts = append(acts, action{kind: actPause, gen: c.gen, step: c.step, reason: "hold", held: true})
	}
	if c.phase == phasePausing {
		for _, m := range c.members {
			if m.inBatch {
				return acts
			}
		}
		// Every worker is between batches, so counts as arrived: it cannot begin another
		// before the release, and has nothing in flight.
		for _, m := range c.members {
			m.arrived = c.gen
		}
		if c.holding {
			c.phase = phaseHeld
			acts = append(acts, action{kind: actHold, gen: c.gen, step: c.step, holds: c.holds})
			c.holds = 0
			return acts
		}
		c.phase = phaseSnapshot
		c.want = false
		c.tryStep, c.tryAt = c.step, c.now
		acts = append(acts, action{kind: actSnapshot, gen: c.gen, step: c.step})
	}
	return acts
}

// requestHold asks for the model to be held still at the next barrier: once no live worker
// holds a batch, ActHold serves it (and every other request made meanwhile). A checkpoint due
// goes first; a recovery under way delays it.
func (c *core) requestHold(now time.Time) []action {
	c.tick(now)
	c.holds++
	return c.advance()
}

// holdDone ends the hold of barrier gen: the barrier comes down.
func (c *core) holdDone(now time.Time, gen uint64) []action {
	c.tick(now)
	if c.phase != phaseHeld || gen != c.gen {
		return nil
	}
	c.releaseArrived()
	c.gen++
	c.phase, c.holding = phaseIdle, false
	c.tryAt = c.tryAt.Add(c.now.Sub(c.pauseAt)) // the pause does not count towards the next interval
	acts := []action{{kind: actRelease, gen: c.gen, reason: "held", held: true}}
	return append(acts, c.advance()...)
}

// releaseArrived restarts the silence of the workers that waited at the barrier.
func (c *core) releaseArrived() {
	for _, m := range c.members {
		if m.arrived == c.gen {
			m.seen = c.now // it waited for us: its silence starts now
		}
	}
}

// stepsDue reports whether the schedule's steps have passed since the last barrier.
func (c *core) stepsDue() bool {
	return c.cfg.every > 0 && c.step-max(c.snapStep, c.tryStep) >= c.cfg.every
}

// timeDue reports whether the schedule's interval has passed since the last barrier.
func (c *core) timeDue() bool {
	return c.cfg.interval > 0 && c.now.Sub(c.tryAt) >= c.cfg.interval
}

// snapshotDone ends the snapshot of barrier gen: the barrier comes down and, if it succeeded,
// the snapshot is committed in the background.
func (c *core) snapshotDone(now time.Time, gen uint64, err error) []action {
	c.tick(now)
	if c.phase != phaseSnapshot || gen != c.gen {
		return nil
	}
	c.releaseArrived()
	c.gen++
	c.phase = phaseIdle
	c.tryAt = c.now // the pause does not count towards the next interval
	if c.stopAtSnapshot {
		c.stopped, c.stopAtSnapshot = true, false // the released workers' next Begin is refused
	}
	acts := []action{{kind: actRelease, gen: c.gen, reason: errReason(err)}}
	if err == nil {
		c.snapStep = c.step
		c.snapshots = append(c.snapshots, c.step)
		acts = append(acts, action{kind: actCommit, step: c.step})
	}
	return append(acts, c.advance()...)
}

// commitDone records the outcome of the commit of step; a step it did not snapshot is ignored.
func (c *core) commitDone(step uint64, err error) {
	if i := slices.Index(c.abandoned, step); i >= 0 {
		c.abandoned = slices.Delete(c.abandoned, i, i+1)
	}
	for i, s := range c.snapshots {
		if s == step {
			c.snapshots = append(c.snapshots[:i], c.snapshots[i+1:]...)
			if err == nil && step > c.committed {
				c.committed = step
			}
			return
		}
	}
}

// restore sets the core to a committed state: the commit of step committed, with steps counted
// on from step (at least committed: a coordinator that takes over counts above the snapshots its
// servers hold; from one past step when that is above committed). The core runs as incarnation
// inc, later than any that came before, so every earlier epoch is void; members join again.
func (c *core) restore(step, committed, inc uint64) {
	step = max(step, committed)
	snap := step
	if step > committed {
		// The servers hold a snapshot of step that no commit covers (an earlier coordinator
		// died before committing it): the next snapshot must be of a later step (a server's
		// checkpointer refuses the same one), and a checkpoint asked for before any batch must
		// take one, not wait for that snapshot's commit, which never comes.
		step++
		snap = committed
	}
	c.step, c.snapStep, c.tryStep, c.committed = step, snap, step, committed
	c.tryAt = c.now
	c.incarnation = inc
	c.lastEpoch = c.incarnation << 32
	c.members = map[string]*member{}
	c.snapshots = nil
	c.phase, c.want, c.holding = phaseIdle, false, false
	if c.barrierUp() {
		c.gen++
	}
}

func (c *core) sortedMembers() []string {
	ids := make([]string, 0, len(c.members))
	for id := range c.members {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func errReason(err error) string {
	if err == nil {
		return "snapshot taken"
	}
	return "snapshot failed: " + err.Error()
}

func epochsString(es []uint64) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = epochString(e)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
