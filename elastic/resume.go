package elastic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/ps"
)

// Resume restores the newest commit and makes this coordinator the job's, as a new
// incarnation: every epoch an earlier coordinator issued is void, its calls to the servers are
// refused (ErrSuperseded) and its later commits are void in storage (checkpoint's Claim). It
// returns the committed step and the program's job state (Config.JobState) of that commit;
// checkpoint.ErrNoCheckpoint means there is none. Call it before any worker joins. A coordinator
// over the commits of an earlier run trains only once Resume has restored one of them (see
// Config.Overwrite).
//
// How depends on what NewCoordinator found on the servers:
//
//   - Fresh servers (the whole job restarted): every server loads the slots the owner table
//     gives it from the newest commit every server can load (any number of servers), and the
//     dispatcher and the ledger come back.
//   - Servers still running a job (only the coordinator restarted): the coordinator takes the
//     job over. When every server is up, under one owner table naming exactly Config.Servers,
//     and no commit was written after the newest one, the servers keep their rows and go on:
//     the dispatcher returns to the commit, and the batches trained since are replayed, each
//     skipped by the servers that applied it (they keep every position not covered by the
//     newest commit), so nothing is lost or counted twice. Servers left behind on an older
//     table, because the earlier coordinator died giving out the newest one (a move's group, a
//     recovery's new placement), are given it first and forget the slots it took from them:
//     a table goes out only once its owners hold their slots. A move cut short this way leaves
//     the placement part of the way; setting the server count again finishes it. Otherwise
//     (a server restarted, a server restored for a table it has not installed, tables that
//     disagree otherwise, a later commit) every server returns to the commit (as under
//     Rollback, from its own shared memory where it has it). A job with no commit yet returns
//     to its start.
//
// Either way a commit that cannot be restored (a chunk that fails its checksum, an object
// missing, on any server) is moved aside (checkpoint's Quarantine) and the one before it is
// restored instead; ResumeReport lists them.
func (c *Coordinator) Resume(ctx context.Context) (uint64, []byte, error) {
	r, err := c.ResumeReport(ctx)
	return r.Step, r.Job, err
}

// Resumed is what ResumeReport did.
type Resumed struct {
	// Step is the commit restored (0: a running job taken over before its first commit) and Job
	// the program's job state (Config.JobState) saved with it.
	Step uint64
	Job  []byte
	// Skipped are the newer commits that could not be restored, newest first, each with the
	// reason, which names the object that failed. Each was moved aside (checkpoint's
	// Quarantine) rather than deleted: Quarantined[i] is where Skipped[i] went, "" when moving
	// it failed (logged; the commit is then deleted with the others above Step).
	Skipped     []checkpoint.SkippedCommit
	Quarantined []string
	// Cleaned counts the objects removed at a resume of a stopped job: persists never committed
	// and temporary files of writes a killed process left (checkpoint's Clean).
	Cleaned int
	// BatchSize is the records per batch the job's commit records: every worker must read with
	// it (Join refuses another), so a program checks its own before it starts any (0: the
	// commit records none).
	BatchSize int
}

// ResumeReport is Resume that also says which newer commits it skipped and where it moved
// them: a program shows these, since a skipped commit means damaged storage and lost
// training. Skipped is filled in also when the error is checkpoint.ErrNoCheckpoint.
func (c *Coordinator) ResumeReport(ctx context.Context) (Resumed, error) {
	if c.committer == nil {
		return Resumed{}, fmt.Errorf("%w: no checkpoint storage", ErrInvalidConfig)
	}
	var res Resumed
	step, job, err := c.resume(ctx, &res)
	res.Step, res.Job = step, job
	if err == nil {
		c.mu.Lock()
		res.BatchSize = c.batch
		c.mu.Unlock()
	}
	c.resumeDone(ctx, err)
	return res, err
}

// resumeDone lifts the refusal to train over an earlier run's commits once Resume restored one
// of them, or found none restorable and moved every one aside (a fresh start loses nothing
// then). After any other failure the commits are still there and the refusal stands.
func (c *Coordinator) resumeDone(ctx context.Context, err error) {
	c.mu.Lock()
	existing := c.existing
	c.mu.Unlock()
	switch {
	case existing == nil:
		return
	case err == nil:
		existing = nil
	case errors.Is(err, checkpoint.ErrNoCheckpoint):
		switch ferr := c.committer.PrepareFresh(ctx, false); {
		case ferr == nil || errors.Is(ferr, checkpoint.ErrExistingCommits):
			existing = ferr
		default:
			c.log.Warn("could not look for the earlier run's commits again", "err", ferr)
		}
	}
	c.mu.Lock()
	c.existing = existing
	c.mu.Unlock()
}

func (c *Coordinator) resume(ctx context.Context, res *Resumed) (uint64, []byte, error) {
	if c.cfg.CheckJob != nil {
		// Vet the newest commit first: tables of another shape would fail verification and
		// hide the reason behind a schema error.
		commits, err := c.committer.Commits(ctx)
		if err != nil {
			return 0, nil, err
		}
		if len(commits) > 0 {
			if job, err := c.committer.Blob(ctx, commits[0].Step, blobJob); err == nil {
				if err := c.cfg.CheckJob(job); err != nil {
					return 0, nil, err
				}
			}
		} else if !c.isLive() {
			return 0, nil, checkpoint.ErrNoCheckpoint
		}
	}
	if c.isLive() {
		return c.takeOver(ctx, res)
	}
	table := c.holder.Get()
	servers := c.serverList()
	info, skipped, err := c.committer.ChooseReport(ctx, func(ctx context.Context, step uint64) error {
		return onEach(ctx, servers, func(ctx context.Context, _ int, s ParameterServer) error { return s.Verify(ctx, step, table) })
	})
	res.Skipped = skipped
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		// Nothing restores: the damaged commits are moved aside all the same, so that a fresh
		// start in this storage does not take them for a run to continue.
		c.quarantine(ctx, res)
	}
	if err != nil {
		return 0, nil, err
	}
	cm, err := c.readCommit(ctx, info.Step)
	if err != nil {
		return 0, nil, err
	}
	inc, err := c.newIncarnation(ctx, info.Step, cm.state.Incarnation, nil)
	if err != nil {
		return 0, nil, err
	}
	// Lead and fence first, so nothing of an earlier coordinator lands while the servers load.
	if err := c.leadAndFence(ctx, servers, inc); err != nil {
		return 0, nil, err
	}
	err = onEach(ctx, servers, func(ctx context.Context, _ int, s ParameterServer) error {
		if err := s.Load(ctx, info.Step, table); err != nil {
			return fmt.Errorf("load step %d on %s: %w", info.Step, s.Node().ID, err)
		}
		return nil
	})
	if err != nil {
		return 0, nil, err
	}
	c.quarantine(ctx, res)
	if err := c.resumed(ctx, cm, info.Step, inc); err != nil {
		return 0, nil, err
	}
	// The servers are fresh and nothing persists before a worker joins: what no commit can
	// restore (a generation persisted but never committed, half-written files) goes now.
	cl, err := c.committer.Clean(ctx)
	if err != nil {
		c.log.Warn("could not clean the checkpoint storage", "err", err)
	}
	res.Cleaned = cl.DeletedObjects + cl.Temporary
	return info.Step, cm.job, nil
}

// quarantine moves the commits in res.Skipped aside (before resumed drops every commit above
// the one restored) and records where each went.
func (c *Coordinator) quarantine(ctx context.Context, res *Resumed) {
	res.Quarantined = make([]string, len(res.Skipped))
	for i, s := range res.Skipped {
		dir, err := c.committer.Quarantine(ctx, s.Step, s.Err)
		if err != nil {
			c.log.Warn("could not move a damaged commit aside", "step", s.Step, "err", err)
			continue
		}
		res.Quarantined[i] = dir
	}
}

// setAside moves the commit of step aside (checkpoint's Quarantine) because restoring it failed
// with why, a damaged commit's error (checkpointDamaged), records it in skipped and
// quarantined (where it went, "" when moving it failed: the caller then deletes it with the
// commits above the one it restores), and returns the newest commit before it. With none left
// it fails with checkpoint.ErrNoCheckpoint: the job's start is no fallback for a job that
// committed, since all its training would be lost.
func (c *Coordinator) setAside(ctx context.Context, step uint64, why error, skipped *[]checkpoint.SkippedCommit, quarantined *[]string) (uint64, error) {
	c.log.Warn("skipping a damaged commit", "step", step, "err", why)
	dir, err := c.committer.Quarantine(ctx, step, why)
	if err != nil {
		c.log.Warn("could not move a damaged commit aside", "step", step, "err", err)
	}
	*skipped = append(*skipped, checkpoint.SkippedCommit{Step: step, Err: why})
	*quarantined = append(*quarantined, dir)
	commits, err := c.committer.Commits(ctx)
	if err != nil {
		return 0, err
	}
	for _, ci := range commits {
		if ci.Step < step {
			return ci.Step, nil
		}
	}
	return 0, fmt.Errorf("%w: the commit of step %d is damaged (%v), and no commit is left before it", checkpoint.ErrNoCheckpoint, step, why)
}

// commitState is what the coordinator keeps in a commit.
type commitState struct {
	step  uint64
	state coordState
	disp  []byte
	led   *ledger
	done  Progress
	job   []byte
}

// readCommit reads the coordinator's part of the commit of step; step 0 is the job's start.
func (c *Coordinator) readCommit(ctx context.Context, step uint64) (*commitState, error) {
	cm := &commitState{step: step, state: coordState{Version: 1, Job: c.cfg.Job}}
	var err error
	if cm.disp, cm.led, err = c.commitData(ctx, step); err != nil {
		return nil, err
	}
	if step == 0 {
		return cm, nil
	}
	raw, err := c.committer.Blob(ctx, step, blobState)
	if err != nil {
		return nil, fmt.Errorf("elastic: commit %d: %w", step, err)
	}
	if err := json.Unmarshal(raw, &cm.state); err != nil || cm.state.Version != 1 {
		return nil, fmt.Errorf("elastic: commit %d: coordinator state unreadable (version %d): %v", step, cm.state.Version, err)
	}
	if cm.state.Job != c.cfg.Job {
		return nil, fmt.Errorf("elastic: commit %d belongs to job %q, not %q", step, cm.state.Job, c.cfg.Job)
	}
	if cm.state.BatchSize > 0 {
		// The positions the commit and the servers hold are of this batch size.
		c.mu.Lock()
		c.batch = cm.state.BatchSize
		c.mu.Unlock()
	}
	if cm.done, err = c.commitProgress(ctx, step); err != nil {
		return nil, err
	}
	if c.cfg.JobState != nil {
		if cm.job, err = c.committer.Blob(ctx, step, blobJob); err != nil {
			return nil, fmt.Errorf("elastic: commit %d: %w", step, err)
		}
	}
	if c.cfg.CheckJob != nil {
		if err := c.cfg.CheckJob(cm.job); err != nil {
			return nil, err
		}
	}
	return cm, nil
}

// commitProgress reads how far the data was done at the commit of step (none before any).
func (c *Coordinator) commitProgress(ctx context.Context, step uint64) (Progress, error) {
	if step == 0 {
		return Progress{}, nil
	}
	raw, err := c.committer.Blob(ctx, step, blobProgress)
	if err != nil {
		return Progress{}, fmt.Errorf("elastic: commit %d: %w", step, err)
	}
	var p Progress
	if err := p.UnmarshalBinary(raw); err != nil {
		return Progress{}, fmt.Errorf("elastic: commit %d: progress: %w", step, err)
	}
	return p, nil
}

// newIncarnation claims the job in storage for a coordinator restoring the commit of step, and
// returns its incarnation: above the claim's, the committing coordinator's (prev) and every
// one the servers follow (found: their Health).
func (c *Coordinator) newIncarnation(ctx context.Context, step, prev uint64, found map[string]ServerHealth) (uint64, error) {
	c.mu.Lock()
	inc := max(prev, c.core.incarnation) + 1
	c.mu.Unlock()
	for _, h := range found {
		inc = max(inc, h.Leader+1)
	}
	if _, ok := c.cfg.Storage.(checkpoint.ExclusiveStorage); ok {
		claimed, err := c.committer.Claim(ctx, step)
		if err != nil {
			return 0, err
		}
		inc = max(inc, claimed)
	}
	return inc, nil
}

// resumed sets the coordinator to the commit cm, as incarnation inc, with steps counted on from
// step, and drops the commits above it (a future the job abandoned).
func (c *Coordinator) resumed(ctx context.Context, cm *commitState, step, inc uint64) error {
	if err := c.svc.restore(cm.disp, cm.led); err != nil {
		return fmt.Errorf("elastic: commit %d: dispatcher: %w", cm.step, err)
	}
	c.mu.Lock()
	c.core.restore(step, cm.step, inc)
	c.fenced = nil
	c.committedDone = cm.done
	c.stats.LastCommitted = cm.step
	c.live = false
	c.applyLocked(nil)
	c.mu.Unlock()
	if err := c.committer.DropAfter(ctx, cm.step); err != nil {
		return err
	}
	c.log.Info("resumed", "step", cm.step, "incarnation", inc)
	return nil
}

func (c *Coordinator) isLive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}

// takeOver makes this coordinator the one of a job whose servers are running (see Resume).
func (c *Coordinator) takeOver(ctx context.Context, res *Resumed) (uint64, []byte, error) {
	servers := c.serverList()
	found, err := c.admit(ctx, servers)
	if err != nil {
		return 0, nil, err
	}
	var step uint64
	commits, err := c.committer.Commits(ctx)
	if err != nil {
		return 0, nil, err
	}
	for _, ci := range commits {
		if err := c.checkCommit(ctx, ci.Step); err != nil {
			if errors.Is(err, checkpoint.ErrUnsupportedVersion) {
				// A later release wrote it: going back to an older commit would lose its work.
				return 0, nil, fmt.Errorf("commit of step %d: %w", ci.Step, err)
			}
			c.log.Warn("skipping commit", "step", ci.Step, "err", err)
			if checkpointDamaged(err) {
				res.Skipped = append(res.Skipped, checkpoint.SkippedCommit{Step: ci.Step, Err: err})
			}
			continue
		}
		step = ci.Step
		break
	}
	cm, err := c.readCommit(ctx, step)
	if err != nil {
		return 0, nil, err
	}
	inc, err := c.newIncarnation(ctx, step, cm.state.Incarnation, found)
	if err != nil {
		return 0, nil, err
	}
	// From here on the earlier coordinator can neither drive the servers (they follow inc) nor
	// land a worker's push (every epoch below inc<<32 is fenced).
	if err := c.leadAndFence(ctx, servers, inc); err != nil {
		return 0, nil, err
	}
	// A commit record above step was written by the earlier coordinator after we chose the
	// commit: it may have had the servers forget positions the commit does not cover. (Damaged
	// ones count too, so they are moved aside only after this.)
	after, err := c.committer.RecordsAfter(ctx, step)
	if err != nil {
		return 0, nil, err
	}
	c.quarantine(ctx, res)
	tables := make([]*ps.OwnerTable, len(servers))
	err = onEach(ctx, servers, func(ctx context.Context, i int, s ParameterServer) (err error) {
		tables[i], err = s.Table(ctx)
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	var newest *ps.OwnerTable
	var snapped uint64
	for i, s := range servers {
		if t := tables[i]; t != nil && (newest == nil || t.Version > newest.Version) {
			newest = t
		}
		snapped = max(snapped, found[s.Node().ID].Snapshot)
	}
	why := ""
	switch {
	case len(after) > 0:
		why = fmt.Sprintf("commits %v were written after the commit of step %d", after, step)
	case newest == nil:
		why = "no server has an owner table"
	case !sameNodes(newest, servers):
		why = fmt.Sprintf("owner table %d names other servers than the job's", newest.Version)
	}
	var lagging []ParameterServer
	for i, s := range servers {
		switch t := tables[i]; {
		case why != "":
		case found[s.Node().ID].Restoring != 0:
			why = fmt.Sprintf("server %s was being restored for owner table %d", s.Node().ID, found[s.Node().ID].Restoring)
		case t == nil:
			why = fmt.Sprintf("server %s has no owner table (it restarted)", s.Node().ID)
		case t.Equal(newest):
		case t.Version < newest.Version:
			lagging = append(lagging, s)
		default:
			why = fmt.Sprintf("server %s has another owner table %d", s.Node().ID, t.Version)
		}
	}
	if why == "" && len(lagging) > 0 {
		// The earlier coordinator died publishing newest: finish the publication. A table goes
		// out only once every owner it names holds its slots (a move's handover, a recovery's
		// restore), so the servers that missed it hold what it gives them; they forget the
		// slots it takes from them, whose moves Lead called off.
		if err := c.finishPublication(ctx, lagging, newest); err != nil {
			why = fmt.Sprintf("owner table %d could not be given to every server: %v", newest.Version, err)
		} else {
			ids := idsOf(lagging)
			c.log.Warn("finished publishing the owner table the earlier coordinator was giving out", "table", newest.Version, "servers", ids)
		}
	}
	if why == "" {
		c.holder.Set(newest)
		if err := c.resumed(ctx, cm, snapped, inc); err != nil {
			return 0, nil, err
		}
		c.log.Info("took over a running job", "commit", step, "table", newest.Version, "incarnation", inc)
		return step, cm.job, nil
	}
	// Every server returns to the commit, under a new table over the job's servers.
	c.log.Warn("taking over by returning every server to the newest commit", "commit", step, "reason", why)
	nodes := nodesOf(servers)
	version := uint64(1)
	if newest != nil {
		version = newest.Version + 1
	}
	table, err := ps.NewOwnerTable(version, c.cfg.Slots, nodes, newest)
	if err != nil {
		return 0, nil, err
	}
	// A commit whose data turns out damaged is moved aside and the one before it restored, as
	// for fresh servers (Choose) and in a rollback.
	for {
		err := c.restoreEach(ctx, servers, step, table, RestoreAll)
		if err == nil {
			break
		}
		for {
			if step == 0 || !checkpointDamaged(err) {
				return 0, nil, err
			}
			if step, err = c.setAside(ctx, step, err, &res.Skipped, &res.Quarantined); err != nil {
				return 0, nil, err
			}
			if cm, err = c.readCommit(ctx, step); err == nil {
				break
			}
		}
	}
	if err := c.install(ctx, servers, table); err != nil {
		return 0, nil, err
	}
	if err := c.resumed(ctx, cm, snapped, inc); err != nil {
		return 0, nil, err
	}
	return step, cm.job, nil
}

// finishPublication installs t on servers, which have an older table, and has them forget the
// slots it takes from them.
func (c *Coordinator) finishPublication(ctx context.Context, servers []ParameterServer, t *ps.OwnerTable) error {
	return onEach(ctx, servers, func(ctx context.Context, _ int, s ParameterServer) error {
		if err := s.InstallTable(ctx, t); err != nil {
			return fmt.Errorf("install on %s: %w", s.Node().ID, err)
		}
		if err := s.Restore(ctx, 0, t, RestoreForget); err != nil {
			return fmt.Errorf("forget the slots %s gave away: %w", s.Node().ID, err)
		}
		return nil
	})
}

// checkCommit checks that the coordinator's part of the commit of step reads back.
func (c *Coordinator) checkCommit(ctx context.Context, step uint64) error {
	var errs []error
	for _, name := range []string{blobState, blobDispatcher, blobLedger, blobProgress} {
		if _, err := c.committer.Blob(ctx, step, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkpointDamaged reports whether err says a commit cannot be restored (as opposed to a
// failure to read it).
func checkpointDamaged(err error) bool {
	return errors.Is(err, checkpoint.ErrCorrupt) || errors.Is(err, checkpoint.ErrNotFound) || errors.Is(err, checkpoint.ErrNotCommitted)
}

// sameNodes reports whether t places slots on exactly servers (ids and addresses).
func sameNodes(t *ps.OwnerTable, servers []ParameterServer) bool {
	missing := func(n ps.Node) bool { return !slices.Contains(t.Nodes, n) }
	return len(t.Nodes) == len(servers) && !slices.ContainsFunc(nodesOf(servers), missing)
}

// JobRunning reports whether any of servers holds a running job (it serves an owner table or
// follows a coordinator): a coordinator starting then takes the job over (Resume), and its
// program must not clear the job's checkpoints as a fresh start would. When no server that
// answered holds a job and some did not answer, it cannot tell, and returns their errors (a
// remote server not up yet: ErrUnavailable) for the caller to wait and ask again.
func JobRunning(ctx context.Context, servers []ParameterServer) (bool, error) {
	var errs []error
	for _, s := range servers {
		h, err := s.Health(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Node().ID, err))
			continue
		}
		if h.TableVersion != 0 || h.Leader != 0 {
			return true, nil
		}
	}
	return false, errors.Join(errs...)
}

// leadAndFence makes incarnation inc the coordinator servers obey and fences every epoch an
// earlier incarnation issued (those below inc<<32).
func (c *Coordinator) leadAndFence(ctx context.Context, servers []ParameterServer, inc uint64) error {
	if err := c.lead(ctx, servers, inc); err != nil {
		return err
	}
	return c.fence(ctx, servers, inc<<32, nil)
}
