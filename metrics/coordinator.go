package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
)

// StatusSource is what a Coordinator reads at each scrape: *elastic.Coordinator, or a
// StatusFunc. Status must not block for long.
type StatusSource interface {
	Status() elastic.Status
}

var _ StatusSource = (*elastic.Coordinator)(nil)

// StatusFunc is a StatusSource that calls itself: say, one that reads the current coordinator
// of a job whose coordinator may be replaced (local.Job.Coordinator).
type StatusFunc func() elastic.Status

// Status implements StatusSource.
func (f StatusFunc) Status() elastic.Status { return f() }

// Result label values: a checkpoint, recovery or decision that succeeded or failed.
const (
	ResultOK     = "ok"
	ResultFailed = "failed"
)

// Coordinator is a job's coordinator's metrics: a prometheus.Collector that reads the
// coordinator's Status at each scrape (SetSource), and takes its checkpoint, recovery and
// autoscaler events (ObserveCheckpoint, ObserveRecovery, ObserveDecision; Hook chains the
// first two into an elastic.Config). Safe for concurrent use. Its series:
//
//	from the Status, at each scrape:
//	elasticps_coordinator_servers{state}                    gauge    parameter servers: serving, silent (missed health checks), failed
//	elasticps_coordinator_workers{state}                    gauge    workers: training (in a batch), waiting (between batches)
//	elasticps_coordinator_phase{phase}                      gauge    1 for the coordinator's phase (training, checkpoint, held, recovering, stopped, superseded), 0 for the others
//	elasticps_coordinator_incarnation                       gauge    the coordinators the job has had
//	elasticps_coordinator_planned_servers                   gauge    parameter servers of the newest plan (0: none set)
//	elasticps_coordinator_planned_workers                   gauge    workers of the newest plan
//	elasticps_coordinator_owner_table_version               gauge    version of the owner table the servers serve
//	elasticps_coordinator_step                              gauge    batches applied and reported (a rollback takes it back)
//	elasticps_coordinator_data_epoch                        gauge    current data epoch, from 0
//	elasticps_coordinator_data_epochs                       gauge    data epochs of the job
//	elasticps_coordinator_epoch_records                     gauge    records of the current epoch
//	elasticps_coordinator_epoch_trained_records             gauge    records of the current epoch trained
//	elasticps_coordinator_epoch_given_up_records            gauge    records of the current epoch in shards given up
//	elasticps_coordinator_checkpoints_total{stage}          counter  snapshots taken (stage snapshot) and commits written (stage commit)
//	elasticps_coordinator_checkpoint_failures_total         counter  snapshots and commits that failed
//	elasticps_coordinator_last_commit_step                  gauge    step of the newest commit
//	elasticps_coordinator_worker_fences_total               counter  worker epochs fenced
//	elasticps_coordinator_worker_failures_total             counter  workers failed and evicted
//	elasticps_coordinator_server_failures_total             counter  parameter-server failures noticed
//	elasticps_coordinator_lost_records_total                counter  records whose updates a Partial recovery lost
//	elasticps_coordinator_exactly_once_violations           gauge    positions trained twice or lost (elastic.Status.ExactlyOnceViolations): must stay 0
//	elasticps_coordinator_owned_slots{server}               gauge    slots each server owns in the served owner table
//	elasticps_coordinator_migrating_slots                   gauge    slots a move under way is still to hand over
//	elasticps_coordinator_repartition_running               gauge    1 while slots move to a new server count
//	elasticps_coordinator_repartition_slots{state}          gauge    slots of the newest repartition: done, todo (a failed one leaves them to the next)
//	elasticps_coordinator_repartition_copied_bytes          gauge    bytes the newest repartition copied
//
//	from the events:
//	elasticps_coordinator_checkpoint_blocked_seconds        histogram  training paused at each snapshot's barrier (snapshots that succeeded)
//	elasticps_coordinator_checkpoint_persist_seconds        histogram  time from each snapshot to its commit (commits that succeeded)
//	elasticps_coordinator_checkpoint_bytes_total            counter    bytes copied into shared memory by snapshots
//	elasticps_coordinator_recoveries_total{policy,result}   counter    recoveries (result ok) and failed attempts
//	elasticps_coordinator_recovery_duration_seconds{policy} histogram  time from a failure's detection until training went on
//	elasticps_autoscale_decisions_total{kind,result}        counter    autoscaler decisions carried out
//	elasticps_autoscale_decision_duration_seconds{kind}     histogram  time carrying out a decision took
//	elasticps_autoscale_moved_slots_total                   counter    slots moved by decisions' rebalances
//
// The Status's counters are the coordinator's since it started (a coordinator that takes over
// starts them again, which Prometheus's rate reads as a reset); the events' are this
// Coordinator's.
type Coordinator struct {
	srcMu sync.Mutex
	src   StatusSource

	d coordinatorDescs

	blocked, persist prometheus.Histogram
	ckBytes          prometheus.Counter
	recoveries       *prometheus.CounterVec
	recoveryTime     *prometheus.HistogramVec
	decisions        *prometheus.CounterVec
	decisionTime     *prometheus.HistogramVec
	movedSlots       prometheus.Counter
}

type coordinatorDescs struct {
	servers, workers, phase, incarnation, plannedServers, plannedWorkers, tableVersion, step *prometheus.Desc
	epoch, epochs, epochRecords, epochTrained, epochGivenUp                                  *prometheus.Desc
	checkpoints, ckFailures, lastCommit                                                      *prometheus.Desc
	fences, workerFailures, serverFailures, lostRecords                                      *prometheus.Desc
	violations, ownedSlots, migrating                                                        *prometheus.Desc
	repRunning, repSlots, repBytes                                                           *prometheus.Desc
}

var _ prometheus.Collector = (*Coordinator)(nil)

// The upper bounds, in seconds, of a Coordinator's histograms.
func blockedBuckets() []float64  { return prometheus.ExponentialBuckets(0.0005, 2, 16) } // 0.5 ms to 16 s
func persistBuckets() []float64  { return prometheus.ExponentialBuckets(0.01, 2, 16) }   // 10 ms to 5.5 min
func recoveryBuckets() []float64 { return prometheus.ExponentialBuckets(0.05, 2, 14) }   // 50 ms to 7 min
func decisionBuckets() []float64 { return prometheus.ExponentialBuckets(0.01, 2, 16) }   // 10 ms to 5.5 min

// NewCoordinator returns a coordinator's metrics, with no source yet: until SetSource, only
// the event series are reported. cfg.Role defaults to "coordinator", cfg.Node to
// "coordinator".
func NewCoordinator(cfg Config) (*Coordinator, error) {
	cfg = cfg.withDefaults(elastic.RoleCoordinator.String(), elastic.CoordinatorID)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Coordinator{}
	c.d = coordinatorDescs{
		servers:        cfg.desc("coordinator_servers", "Parameter servers by state: serving, silent (missed its last health checks), failed.", "state"),
		workers:        cfg.desc("coordinator_workers", "Workers by state: training (in a batch), waiting (between batches).", "state"),
		phase:          cfg.desc("coordinator_phase", "1 for the coordinator's phase, 0 for the others.", "phase"),
		incarnation:    cfg.desc("coordinator_incarnation", "The coordinators the job has had (restarts, takeovers, rollbacks)."),
		plannedServers: cfg.desc("coordinator_planned_servers", "Parameter servers of the newest plan given to the scaler; 0 if none was."),
		plannedWorkers: cfg.desc("coordinator_planned_workers", "Workers of the newest plan given to the scaler; 0 if none was."),
		tableVersion:   cfg.desc("coordinator_owner_table_version", "Version of the owner table the parameter servers serve."),
		step:           cfg.desc("coordinator_step", "Batches applied and reported; a rollback takes it back to its commit's."),
		epoch:          cfg.desc("coordinator_data_epoch", "The current data epoch, from 0."),
		epochs:         cfg.desc("coordinator_data_epochs", "The data epochs of the job."),
		epochRecords:   cfg.desc("coordinator_epoch_records", "Records of the current data epoch."),
		epochTrained:   cfg.desc("coordinator_epoch_trained_records", "Records of the current data epoch trained."),
		epochGivenUp:   cfg.desc("coordinator_epoch_given_up_records", "Records of the current data epoch in shards that failed too often and were given up."),
		checkpoints:    cfg.desc("coordinator_checkpoints_total", "Checkpoints: snapshots taken (stage snapshot) and commits written (stage commit).", "stage"),
		ckFailures:     cfg.desc("coordinator_checkpoint_failures_total", "Snapshots and commits that failed."),
		lastCommit:     cfg.desc("coordinator_last_commit_step", "Step of the newest commit."),
		fences:         cfg.desc("coordinator_worker_fences_total", "Worker epochs fenced."),
		workerFailures: cfg.desc("coordinator_worker_failures_total", "Workers failed and evicted."),
		serverFailures: cfg.desc("coordinator_server_failures_total", "Parameter-server failures noticed."),
		lostRecords:    cfg.desc("coordinator_lost_records_total", "Records whose updates to restored slots a Partial recovery lost."),
		violations:     cfg.desc("coordinator_exactly_once_violations", "Dataset positions trained more than once, or lost from a finished epoch: must stay 0."),
		ownedSlots:     cfg.desc("coordinator_owned_slots", "Slots each parameter server owns in the served owner table.", "server"),
		migrating:      cfg.desc("coordinator_migrating_slots", "Slots a move under way (a change of the server count, a rebalance) is still to hand to another server."),
		repRunning:     cfg.desc("coordinator_repartition_running", "1 while slots move to a new number of parameter servers."),
		repSlots:       cfg.desc("coordinator_repartition_slots", "Slots of the newest repartition by state: done (moved), todo (to move).", "state"),
		repBytes:       cfg.desc("coordinator_repartition_copied_bytes", "Bytes the newest repartition copied between servers."),
	}
	hopts := func(sub, name, help string, buckets []float64) prometheus.HistogramOpts {
		return prometheus.HistogramOpts{Namespace: Namespace, Subsystem: sub, Name: name, Help: help, ConstLabels: cfg.labels(), Buckets: buckets}
	}
	copts := func(sub, name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: Namespace, Subsystem: sub, Name: name, Help: help, ConstLabels: cfg.labels()}
	}
	c.blocked = prometheus.NewHistogram(hopts("coordinator", "checkpoint_blocked_seconds", "Time training was paused at each snapshot's barrier.", blockedBuckets()))
	c.persist = prometheus.NewHistogram(hopts("coordinator", "checkpoint_persist_seconds", "Time from each snapshot to its commit.", persistBuckets()))
	c.ckBytes = prometheus.NewCounter(copts("coordinator", "checkpoint_bytes_total", "Bytes copied into shared memory by the servers' snapshots."))
	c.recoveries = prometheus.NewCounterVec(copts("coordinator", "recoveries_total", "Recoveries from parameter-server failures (result ok) and failed attempts, by policy."), []string{"policy", "result"})
	c.recoveryTime = prometheus.NewHistogramVec(hopts("coordinator", "recovery_duration_seconds", "Time from a server failure's detection until training could go on, by policy.", recoveryBuckets()), []string{"policy"})
	c.decisions = prometheus.NewCounterVec(copts("autoscale", "decisions_total", "Autoscaler decisions carried out, by kind and result."), []string{"kind", "result"})
	c.decisionTime = prometheus.NewHistogramVec(hopts("autoscale", "decision_duration_seconds", "Time carrying out an autoscaler decision took, by kind.", decisionBuckets()), []string{"kind"})
	c.movedSlots = prometheus.NewCounter(copts("autoscale", "moved_slots_total", "Slots moved by the rebalances of autoscaler decisions."))

	// Every series exists from the start, at zero, so that rates and dashboards see them.
	for _, p := range []elastic.RecoveryPolicy{elastic.Rollback, elastic.Partial} {
		c.recoveries.WithLabelValues(p.String(), ResultOK)
		c.recoveries.WithLabelValues(p.String(), ResultFailed)
		c.recoveryTime.WithLabelValues(p.String())
	}
	for k := autoscale.Plan; k <= autoscale.ShrinkRequest; k++ {
		c.decisions.WithLabelValues(k.String(), ResultOK)
		c.decisions.WithLabelValues(k.String(), ResultFailed)
		c.decisionTime.WithLabelValues(k.String())
	}
	return c, nil
}

// SetSource makes src the coordinator whose Status each scrape reads (nil: none); say, the new
// coordinator of a job whose coordinator was replaced.
func (c *Coordinator) SetSource(src StatusSource) {
	c.srcMu.Lock()
	defer c.srcMu.Unlock()
	c.src = src
}

// Hook chains ObserveCheckpoint and ObserveRecovery into cfg's OnCheckpoint and OnRecovery,
// after the functions they held, which are still called.
func (c *Coordinator) Hook(cfg *elastic.Config) {
	if prev := cfg.OnCheckpoint; prev != nil {
		cfg.OnCheckpoint = func(e elastic.CheckpointEvent) { prev(e); c.ObserveCheckpoint(e) }
	} else {
		cfg.OnCheckpoint = c.ObserveCheckpoint
	}
	if prev := cfg.OnRecovery; prev != nil {
		cfg.OnRecovery = func(e elastic.RecoveryEvent) { prev(e); c.ObserveRecovery(e) }
	} else {
		cfg.OnRecovery = c.ObserveRecovery
	}
}

// ObserveCheckpoint records a snapshot (its pause and bytes) or a commit (its persist time)
// (elastic.Config.OnCheckpoint). A failure is not recorded here: the Status counts it
// (elasticps_coordinator_checkpoint_failures_total).
func (c *Coordinator) ObserveCheckpoint(e elastic.CheckpointEvent) {
	if e.Err != nil {
		return
	}
	if e.Commit {
		c.persist.Observe(seconds(e.Persist))
		return
	}
	c.blocked.Observe(seconds(e.Blocked))
	c.ckBytes.Add(float64(max(e.Bytes, 0)))
}

// ObserveProgress records the checkpoints and recoveries among a coordinator's progress events
// (elastic.Config.OnProgress, which a status page can share): in place of Hook, not beside it,
// or each event counts twice.
func (c *Coordinator) ObserveProgress(ev elastic.ProgressEvent) {
	ev.Observe(c.ObserveCheckpoint, c.ObserveRecovery)
}

// ObserveRecovery records a recovery from parameter-server failures, or a failed attempt
// (elastic.Config.OnRecovery).
func (c *Coordinator) ObserveRecovery(e elastic.RecoveryEvent) {
	policy := e.Policy.String()
	if e.Err != nil {
		c.recoveries.WithLabelValues(policy, ResultFailed).Inc()
		return
	}
	c.recoveries.WithLabelValues(policy, ResultOK).Inc()
	c.recoveryTime.WithLabelValues(policy).Observe(seconds(e.Duration))
}

// ObserveDecision records an autoscaler decision carried out (autoscale.Runner.Tick returns
// them).
func (c *Coordinator) ObserveDecision(a autoscale.Applied) {
	kind, result := a.Decision.Kind.String(), ResultOK
	if a.Err != nil {
		result = ResultFailed
	}
	c.decisions.WithLabelValues(kind, result).Inc()
	c.decisionTime.WithLabelValues(kind).Observe(seconds(a.Took))
	c.movedSlots.Add(float64(max(a.Moves, 0)))
}

// Describe implements prometheus.Collector.
func (c *Coordinator) Describe(ch chan<- *prometheus.Desc) {
	d := &c.d
	for _, x := range []*prometheus.Desc{d.servers, d.workers, d.phase, d.incarnation, d.plannedServers, d.plannedWorkers, d.tableVersion, d.step,
		d.epoch, d.epochs, d.epochRecords, d.epochTrained, d.epochGivenUp, d.checkpoints, d.ckFailures, d.lastCommit,
		d.fences, d.workerFailures, d.serverFailures, d.lostRecords, d.violations, d.ownedSlots, d.migrating, d.repRunning, d.repSlots, d.repBytes} {
		ch <- x
	}
	for _, x := range c.events() {
		x.Describe(ch)
	}
}

func (c *Coordinator) events() []prometheus.Collector {
	return []prometheus.Collector{c.blocked, c.persist, c.ckBytes, c.recoveries, c.recoveryTime, c.decisions, c.decisionTime, c.movedSlots}
}

// Collect implements prometheus.Collector.
func (c *Coordinator) Collect(ch chan<- prometheus.Metric) {
	for _, x := range c.events() {
		x.Collect(ch)
	}
	c.srcMu.Lock()
	src := c.src
	c.srcMu.Unlock()
	if src == nil {
		return
	}
	st := src.Status()
	d := &c.d
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	counter := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, v, labels...)
	}

	var serving, silent, failed, training, waiting int
	for _, s := range st.Servers {
		switch {
		case s.Failed:
			failed++
		case s.Silent:
			silent++
		default:
			serving++
		}
	}
	for _, w := range st.Workers {
		if w.InBatch {
			training++
		} else {
			waiting++
		}
	}
	gauge(d.servers, float64(serving), "serving")
	gauge(d.servers, float64(silent), "silent")
	gauge(d.servers, float64(failed), "failed")
	gauge(d.workers, float64(training), "training")
	gauge(d.workers, float64(waiting), "waiting")
	for _, p := range [...]string{"training", "checkpoint", "held", "recovering", "stopped", "superseded"} { // elastic.Status.Phase
		v := 0.0
		if st.Phase == p {
			v = 1
		}
		gauge(d.phase, v, p)
	}
	gauge(d.incarnation, float64(st.Incarnation))
	gauge(d.plannedServers, float64(st.Plan.Servers))
	gauge(d.plannedWorkers, float64(st.Plan.Workers))
	gauge(d.tableVersion, float64(st.TableVersion))
	gauge(d.step, float64(st.Step))
	gauge(d.epoch, float64(st.Epoch))
	gauge(d.epochs, float64(st.Epochs))
	gauge(d.epochRecords, float64(st.EpochRecords))
	gauge(d.epochTrained, float64(st.EpochDone))
	gauge(d.epochGivenUp, float64(st.EpochGivenUp))
	counter(d.checkpoints, float64(st.Snapshots), "snapshot")
	counter(d.checkpoints, float64(st.Commits), "commit")
	counter(d.ckFailures, float64(st.CheckpointFailures))
	gauge(d.lastCommit, float64(st.LastCommit))
	counter(d.fences, float64(st.Fenced))
	counter(d.workerFailures, float64(st.Evicted))
	counter(d.serverFailures, float64(st.ServerFailures))
	counter(d.lostRecords, float64(st.LostRecords))
	gauge(d.violations, float64(st.ExactlyOnceViolations))
	owned := map[string]int{}
	for _, s := range st.Servers {
		if !s.Failed {
			owned[s.ID] = 0 // a server that owns nothing yet (just started) or any more (drained)
		}
	}
	for _, id := range st.Owners {
		owned[id]++
	}
	for id, n := range owned {
		gauge(d.ownedSlots, float64(n), id)
	}
	gauge(d.migrating, float64(len(st.Migrating)))
	var running, done, todo, copied float64
	if r := st.Repartition; r != nil {
		if r.Running {
			running = 1
		}
		done, todo, copied = float64(r.SlotsDone), float64(max(r.SlotsTotal-r.SlotsDone, 0)), float64(r.Bytes)
	}
	gauge(d.repRunning, running)
	gauge(d.repSlots, done, "done")
	gauge(d.repSlots, todo, "todo")
	gauge(d.repBytes, copied)
}
