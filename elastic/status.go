package elastic

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Status is a running job as its coordinator sees it, with the coordinator's figures since it
// started: what an operator's status command prints, what a cluster scheduler and an autoscaler
// read (Usage adds the servers' counters), and what a program checks at the end of its run. It
// encodes to JSON as is.
type Status struct {
	Job string `json:"job"`
	// Incarnation is the coordinator's: it counts the coordinators the job has had (restarts,
	// takeovers, rollbacks).
	Incarnation uint64 `json:"incarnation"`
	// Phase is "training", "checkpoint" (a barrier is up), "held" (a barrier is up to hold the
	// model still: Coordinator.Digest), "recovering" (a parameter server failed and is not
	// recovered yet), "stopped" or "superseded" (another coordinator took the job over).
	Phase string `json:"phase"`
	// Recovery is the policy for server failures: "rollback" or "partial".
	Recovery string `json:"recovery"`
	// Plan is the last plan SetParallelism gave the scaler; zero if it was never called.
	Plan Plan `json:"plan"`
	// TableVersion is the version of the owner table the servers serve.
	TableVersion uint64         `json:"table_version"`
	Servers      []ServerStatus `json:"servers"`
	Workers      []WorkerStatus `json:"workers"`
	// The data: Epoch is the current data epoch (from 0) of Epochs; EpochRecords the records of
	// the current epoch, EpochDone those trained and EpochGivenUp those of shards that failed too
	// often; Finished is set once every epoch is done.
	Epoch        int   `json:"epoch"`
	Epochs       int   `json:"epochs"`
	EpochRecords int64 `json:"epoch_records"`
	EpochDone    int64 `json:"epoch_done"`
	EpochGivenUp int64 `json:"epoch_given_up,omitempty"`
	Finished     bool  `json:"finished,omitempty"`
	// Step counts the batches applied and reported; LastCommit is the step of the newest commit,
	// LastSnapshot of the newest snapshot taken (committed or not yet).
	Step         uint64 `json:"step"`
	LastCommit   uint64 `json:"last_commit"`
	LastSnapshot uint64 `json:"last_snapshot"`
	Snapshots    int    `json:"snapshots"`
	Commits      int    `json:"commits"`
	// TotalBlocked is the time training was paused at checkpoint barriers, summed; MaxBlocked
	// the longest pause.
	TotalBlocked time.Duration `json:"total_blocked_ns"`
	MaxBlocked   time.Duration `json:"max_blocked_ns"`
	// CheckpointFailures counts snapshots and commits that failed, the newest with LastError.
	CheckpointFailures int    `json:"checkpoint_failures"`
	LastError          string `json:"last_error,omitempty"`
	// Fenced counts the worker epochs fenced, Evicted the workers failed.
	Fenced  int `json:"fenced"`
	Evicted int `json:"evicted"`
	// ServerFailures counts the parameter-server failures noticed, Recoveries the recoveries
	// that succeeded; LastRecovery describes the newest.
	ServerFailures int            `json:"server_failures"`
	Recoveries     int            `json:"recoveries"`
	LastRecovery   *RecoveryEvent `json:"last_recovery,omitempty"`
	// LostRecords sums RecoveryEvent.LostRecords over the recoveries: under Partial, the
	// positions whose updates to the restored slots were lost. Zero means none was lost.
	LostRecords int64 `json:"lost_records"`
	// Repartition describes the newest change of the server count, under way or done.
	Repartition *RepartitionStatus `json:"repartition,omitempty"`
	// Owners names each slot's server in the served owner table (TableVersion), by slot;
	// Migrating lists the slots a move under way (a change of the server count or a
	// rebalance) is still to hand to another server.
	Owners    []string `json:"owners,omitempty"`
	Migrating []int    `json:"migrating,omitempty"`
	// ExactlyOnceViolations sums EpochCheck.Violations over the epochs (ExactlyOnce): the
	// positions trained twice, or lost. It stays zero.
	ExactlyOnceViolations int64 `json:"exactly_once_violations"`
}

// ServerStatus is one parameter server of a Status.
type ServerStatus struct {
	// ID is the server's node id, Addr its RPC address, Incarnation its process's.
	ID          string `json:"id"`
	Addr        string `json:"addr"`
	Incarnation uint64 `json:"incarnation"`
	Failed      bool   `json:"failed,omitempty"`
	Reason      string `json:"reason,omitempty"` // why it failed
	// Unheard is how long ago it last answered a health check.
	Unheard time.Duration `json:"unheard_ns"`
	// Silent is set for a server not failed yet that has missed its last health checks (no
	// answer for more than two HealthEvery): it may be dead, and is failed once it has not
	// answered for ServerTimeout, or at once when a worker reports that it cannot reach it.
	Silent bool `json:"silent,omitempty"`
	// Usage only (zero in a Status): the server's counters (ps.Server.Stats), or UsageError
	// when it could not be read. Uptime is how long its process has run (it starts again at a
	// restart); Busy the time it spent serving rows, summed over its slots (serving is
	// in-memory work, so this is close to its CPU time); MemoryBytes the memory its tables hold
	// (rows and optimizer state), the part of its memory that grows with the model.
	Uptime      time.Duration `json:"uptime_ns,omitempty"`
	Busy        time.Duration `json:"busy_ns,omitempty"`
	MemoryBytes int64         `json:"memory_bytes,omitempty"`
	// Usage only: the server's process (ps.ServerStats.Process), identified by Host and Pid,
	// its CPU time (user and system) since it started, and the memory it holds in RAM
	// (ResidentBytes, shared pages included: the flash checkpoint's shared memory, say, which
	// may be charged to another process's cgroup). When the process is in a memory cgroup with
	// a limit (a pod's container with a memory limit), CgroupLimitBytes is that limit and
	// CgroupBytes what the cgroup is charged less its inactive file pages (a kubelet's working
	// set): the figure the kernel kills the process for when it goes over the limit.
	// SharedProcess is set when the process also runs the coordinator or another server (an
	// in-process job): its figures are then not the server's alone.
	Host             string        `json:"host,omitempty"`
	Pid              int           `json:"pid,omitempty"`
	CPU              time.Duration `json:"cpu_ns,omitempty"`
	ResidentBytes    int64         `json:"resident_bytes,omitempty"`
	CgroupBytes      int64         `json:"cgroup_bytes,omitempty"`
	CgroupLimitBytes int64         `json:"cgroup_limit_bytes,omitempty"`
	SharedProcess    bool          `json:"shared_process,omitempty"`
	UsageError       string        `json:"usage_error,omitempty"`
}

// Use is what the server itself uses, as far as a Usage reading tells. When the process is its
// own (read, and not SharedProcess) that is the process's (own): its memory cgroup's charge
// (CgroupBytes) where it has a cgroup with a limit, which is what the limit is held against,
// else its resident memory. Otherwise it is its tables' memory. Its CPU is UsedSince's.
func (s ServerStatus) Use() (memory int64, own bool) {
	if s.Pid == 0 || s.SharedProcess {
		return s.MemoryBytes, false
	}
	if s.CgroupLimitBytes > 0 {
		return s.CgroupBytes, true
	}
	return cmp.Or(s.ResidentBytes, s.MemoryBytes), true
}

// UsedSince is the CPU time the server used between prev and s, two Usage readings of it: its
// process's (own) when both readings are of one process of its own, else its serving time
// (Busy); zero when the counters went back (a restart).
func (s ServerStatus) UsedSince(prev ServerStatus) (cpu time.Duration, own bool) {
	_, was := prev.Use()
	if _, is := s.Use(); is && was && s.Pid == prev.Pid && s.Host == prev.Host && s.CPU >= prev.CPU {
		return s.CPU - prev.CPU, true
	}
	return max(s.Busy-prev.Busy, 0), false
}

// WorkerStatus is one worker of a Status.
type WorkerStatus struct {
	ID      string `json:"id"`
	Epoch   string `json:"epoch"` // its fence epoch, incarnation.n
	InBatch bool   `json:"in_batch,omitempty"`
	// Unheard is how long ago the coordinator last heard from it (time paused at barriers
	// does not count).
	Unheard time.Duration `json:"unheard_ns"`
	// Steps counts its batches applied and reported (Begin to End), which took Busy in all;
	// the time a checkpoint barrier holds the workers does not count.
	Steps uint64        `json:"steps"`
	Busy  time.Duration `json:"busy_ns"`
}

// Status returns the job's status now.
func (c *Coordinator) Status() Status {
	now := c.clock.now()
	c.svc.mu.Lock()
	pr := c.disp.Progress()
	checks := c.exactlyOnceLocked(pr)
	c.svc.mu.Unlock()
	st := Status{Job: c.cfg.Job, Recovery: c.cfg.Recovery.String()}
	for _, e := range checks {
		st.ExactlyOnceViolations += e.Violations()
	}
	if t := c.holder.Get(); t != nil {
		st.TableVersion = t.Version
		st.Owners = make([]string, t.Slots)
		for sl := range st.Owners {
			st.Owners[sl] = t.Owner(sl).ID
		}
		st.Migrating = c.migrating(t)
	}
	st.Epoch, st.Epochs, st.Finished = pr.Epoch, pr.Epochs, pr.Finished
	for _, e := range pr.EpochRecords {
		if e.Epoch == pr.Epoch {
			st.EpochRecords, st.EpochDone, st.EpochGivenUp = e.Records, e.Done, e.Failed
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.core
	st.Incarnation, st.Plan, st.Step = k.incarnation, c.plan, k.step
	switch {
	case c.superseded != nil:
		st.Phase = "superseded"
	case k.recovering:
		st.Phase = "recovering"
	case k.stopped:
		st.Phase = "stopped"
	case k.holding:
		st.Phase = "held"
	case k.phase != phaseIdle:
		st.Phase = "checkpoint"
	default:
		st.Phase = "training"
	}
	for _, s := range c.servers {
		id := s.Node().ID
		ss := ServerStatus{ID: id, Addr: s.Node().Addr}
		if e := k.servers[id]; e != nil {
			ss.Incarnation, ss.Failed, ss.Reason, ss.Unheard = e.inc, e.failed, e.reason, now.Sub(e.lastOK)
			ss.Silent = !e.failed && ss.Unheard > 2*c.cfg.HealthEvery
		}
		st.Servers = append(st.Servers, ss)
	}
	// A failed server whose slots went to the survivors is no longer in c.servers.
	for id, e := range k.servers {
		if e.failed && !slices.ContainsFunc(st.Servers, func(s ServerStatus) bool { return s.ID == id }) {
			st.Servers = append(st.Servers, ServerStatus{ID: id, Addr: e.node.Addr, Incarnation: e.inc, Failed: true, Reason: e.reason, Unheard: now.Sub(e.lastOK)})
		}
	}
	sort.Slice(st.Servers, func(i, j int) bool { return st.Servers[i].ID < st.Servers[j].ID })
	cnow := c.clock.now()
	for _, id := range k.sortedMembers() {
		m := k.members[id]
		ws := cmp.Or(c.steps[id], &workerSteps{})
		st.Workers = append(st.Workers, WorkerStatus{ID: id, Epoch: epochString(m.epoch), InBatch: m.inBatch, Unheard: max(0, cnow.Sub(m.seen)),
			Steps: ws.steps, Busy: ws.busy})
	}
	st.Repartition = c.Repartition()
	s := c.stats
	st.LastCommit, st.LastSnapshot, st.Snapshots, st.Commits, st.CheckpointFailures = s.LastCommitted, s.LastSnapshot, s.Snapshots, s.Committed, s.Failed
	st.TotalBlocked, st.MaxBlocked = s.TotalBlocked, s.MaxBlocked
	if s.LastErr != nil {
		st.LastError = s.LastErr.Error()
	}
	st.Fenced, st.Evicted, st.ServerFailures, st.Recoveries = s.Fenced, s.Evicted, k.serverFailures, s.Recoveries
	st.LostRecords = s.LostRecords
	if s.Recoveries > 0 {
		r := s.LastRecovery
		st.LastRecovery = &r
	}
	return st
}

// WriteText writes st for a person to read: a summary, then a line per server and worker.
func (st Status) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "job %s: %s, coordinator incarnation %d, recovery %s\n", st.Job, st.Phase, st.Incarnation, st.Recovery)
	if st.Plan != (Plan{}) {
		fmt.Fprintf(&b, "plan: %s\n", st.Plan)
	}
	fmt.Fprintf(&b, "data: epoch %d of %d, %d of %d records trained", st.Epoch+1, st.Epochs, st.EpochDone, st.EpochRecords)
	if st.EpochGivenUp > 0 {
		fmt.Fprintf(&b, ", %d given up", st.EpochGivenUp)
	}
	if st.Finished {
		b.WriteString(", finished")
	}
	fmt.Fprintf(&b, "\nsteps: %d; checkpoints: %d taken, %d committed (newest at step %d), %d failed\n",
		st.Step, st.Snapshots, st.Commits, st.LastCommit, st.CheckpointFailures)
	if st.LastError != "" {
		fmt.Fprintf(&b, "last checkpoint error: %s\n", st.LastError)
	}
	fmt.Fprintf(&b, "workers: %d fenced epochs, %d failed; servers: %d failures, %d recoveries", st.Fenced, st.Evicted, st.ServerFailures, st.Recoveries)
	if st.LostRecords > 0 {
		fmt.Fprintf(&b, ", %d records' updates lost in all", st.LostRecords)
	}
	b.WriteString("\n")
	if r := st.LastRecovery; r != nil {
		ids := slices.Sorted(maps.Keys(r.Failed))
		failed := make([]string, len(ids))
		for i, id := range ids {
			failed[i] = fmt.Sprintf("%s (%s)", id, r.Failed[id])
		}
		fmt.Fprintf(&b, "last recovery: %s of %s from the commit of step %d in %v, owner table %d", r.Policy, strings.Join(failed, ", "), r.Step, r.Duration.Round(time.Millisecond), r.TableVersion)
		if r.LostRecords > 0 {
			fmt.Fprintf(&b, ", %d records' updates lost (%.3f%%)", r.LostRecords, 100*r.LostShare())
		}
		b.WriteString("\n")
	}
	if r := st.Repartition; r != nil {
		state := "done in " + r.Duration.Round(time.Millisecond).String()
		switch {
		case r.Running:
			state = "moving"
		case r.Err != "":
			state = "failed: " + r.Err
		}
		fmt.Fprintf(&b, "servers %d -> %d: %s; %d of %d slots moved (%d rows, %.1f MiB), longest fence %v\n",
			r.From, r.To, state, r.SlotsDone, r.SlotsTotal, r.MovedRows, float64(r.Bytes)/(1<<20), r.MaxFenced.Round(time.Microsecond))
	}
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nSERVER\tADDRESS\tINCARNATION\tSTATE\tLAST ANSWER\n")
	for _, s := range st.Servers {
		state := "serving"
		switch {
		case s.Failed:
			state = "failed: " + s.Reason
		case s.Silent:
			state = "not answering"
		}
		fmt.Fprintf(tw, "%s\t%s\t%x\t%s\t%v ago\n", s.ID, s.Addr, s.Incarnation, state, s.Unheard.Round(time.Millisecond))
	}
	fmt.Fprintf(tw, "\nWORKER\tEPOCH\tSTATE\tLAST HEARD\n")
	for _, w := range st.Workers {
		state := "between batches"
		if w.InBatch {
			state = "in a batch"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v ago\n", w.ID, w.Epoch, state, w.Unheard.Round(time.Millisecond))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// SetScaler makes s the coordinator's scaler (Config.Scaler), for a scaler made after the
// coordinator, such as a local.Scaler of its local.Job (local.Job.SetScaler).
func (c *Coordinator) SetScaler(s Scaler) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scaler = s
}

// ErrNoScaler is returned by SetParallelism when the coordinator has no scaler.
var ErrNoScaler = errors.New("elastic: the coordinator has no scaler")

// SetParallelism asks for workers workers and servers parameter servers, of the sizes of the
// current plan (SetPlan), the call a cluster scheduler makes: the coordinator hands the plan to
// its Config.Scaler, whose new workers join while the others train, and whose workers beyond
// the plan are stopped (their shards go back to the dispatcher at their last reported
// offsets). A new server count is reached while training goes on (live repartition): the
// scaler (a ServerScaler; otherwise errors.ErrUnsupported) starts the new servers, the
// coordinator moves onto them, or off the highest-numbered ones, only the slots whose owner
// changes, and the scaler stops the drained servers. It returns once the slots have moved.
func (c *Coordinator) SetParallelism(ctx context.Context, workers, servers int) error {
	c.mu.Lock()
	plan := c.plan
	c.mu.Unlock()
	plan.Workers, plan.Servers = workers, servers
	return c.SetPlan(ctx, plan)
}

// SetPlan hands plan, with its process sizes, to the scaler (see SetParallelism). ErrClosed
// once the coordinator is closed: the job's processes are no longer its to change.
func (c *Coordinator) SetPlan(ctx context.Context, plan Plan) error {
	if err := plan.Validate(); err != nil {
		return err
	}
	c.mu.Lock()
	have, scaler, incomplete, closed := len(c.servers), c.scaler, c.repIncomplete, c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if scaler == nil {
		return ErrNoScaler
	}
	if plan.Servers != have || incomplete {
		ss, ok := scaler.(ServerScaler)
		if !ok {
			return fmt.Errorf("elastic: %d parameter servers asked for, the job has %d: %w (%w)", plan.Servers, have, errNoServerScaler, errors.ErrUnsupported)
		}
		if err := c.repartition(ctx, ss, plan.Servers); err != nil {
			return err
		}
	}
	if err := scaler.Scale(ctx, plan); err != nil {
		return fmt.Errorf("elastic: scale to %s: %w", plan, err)
	}
	c.mu.Lock()
	c.plan = plan
	c.mu.Unlock()
	c.log.Info("parallelism set", "plan", plan)
	return nil
}
