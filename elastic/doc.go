// Package elastic holds the control logic of an elastic training job, so that any Go training
// program gets it by import: the Coordinator owns, for one job, the owner table, the data-shard
// dispatcher, the workers' fence epochs, the checkpoint barrier and schedule, the commits and
// resume; a worker trains through a Session. The same protocol runs in one process and across
// processes, on each process's one authenticated RPC port.
//
// # What lives where
//
// This package is the protocol and its vocabulary: Coordinator and Config; Session, Batch and the
// Control a session calls; the ParameterServer a coordinator drives and the Scaler and
// ServerScaler that run processes; Plan and Resources; Status (with Usage's counters),
// RecoveryEvent, CheckpointEvent and the errors; Member and MemberEvent, what Observe consumes. It
// imports only ps, shard and checkpoint. Each backend is a package of its own that imports it:
//
//	elastic/server       server.Server: a parameter server's side (a ps.Server with its checkpointer)
//	elastic/remote       ServeServer and ServeControl; remote.Server and remote.Control reach them
//	elastic/local        local.Start: a whole job in one process; local.Scaler: goroutine workers
//	elastic/process      process.Scaler: the job's processes on this host, os/exec
//	elastic/membership   membership.Gossip: who is alive, on hashicorp/memberlist
//	elastic/autoscale    what resources the job needs, and a runner that applies them
//	elastic/elastictest  a job on the in-memory network, fault injection, a fake clock, and the
//	                     conformance test every Scaler passes
//
// # A job
//
//	job, err := local.Start(ctx, local.Config{Job: "ctr", Servers: 2, Tables: specs,
//		Coordinator: elastic.Config{Storage: store, CheckpointEvery: 1000, Dispatcher: data}})
//	s, err := job.NewSession("worker-0", shard.ReaderConfig{Source: src, BatchSize: 512})
//	err = s.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
//		... // b.Pull, forward and backward, b.Push: every push carries the fence epoch and b's position
//	})
//	step, err := job.Coordinator().Checkpoint(ctx)
//
// A restarted job calls Coordinator.Resume before its workers join: every server loads the slots
// the new owner table gives it (any number of servers), the dispatcher and the ledger come back,
// and the coordinator runs as a new incarnation (below). A job that does not resume over storage
// holding commits of an earlier run refuses to train (checkpoint.ErrExistingCommits) rather than let
// retention delete them: the program chooses, Resume or Config.Overwrite, and checkpoint.Committer.PrepareFresh lets it
// refuse before it starts anything.
//
// Config.OnProgress hears of the job's progress as it happens, in order: every step trained
// (steps fold while the callback is busy), checkpoint, move of slots and recovery, one
// ProgressEvent each, from a goroutine nothing else waits for; the status page and the metrics
// take the same events (statuspage.Page.ObserveProgress, metrics.Coordinator.ObserveProgress).
// Coordinator.WaitStep waits for a step without polling.
//
// Coordinator.Digest fingerprints the job's model (every embedding table and dense tensor on
// every server, bit for bit: a checkpoint.Digest) with training held at a barrier, the same a
// checkpoint raises, so that no batch is half applied and no slot is handed over meanwhile;
// Coordinator.DigestCommit fingerprints a commit, read from storage. The digest is a sum over
// rows, not over servers: a job and its commit of the same step digest equally whatever the
// number of servers either has, so a program checks a live repartition or a restore with one
// comparison (checkpoint.Digest.Equal) and never reads a server's tables.
//
// A coordinator that another one takes the job over from stops for good: its Done channel closes
// and Err wraps ErrSuperseded, so that the program's run loop ends at once.
//
// # The barrier core
//
// The coordinator's protocol state is an I/O-free core: events (a worker joins, begins or ends a
// batch, leaves, fails; a server answers a health call or not, is reported; a snapshot, commit or
// restore finishes; the clock moves) go in, and actions (fence these epochs on every server, evict
// a worker, pause, snapshot at a step, release, commit, abandon a snapshot, probe the failed
// servers, restore under this policy and owner table) come out, in the order the driver carries
// them out. Every decision on elapsed time reads Config.Now. Its behaviour is pinned by the trace
// scripts in testdata (TestCoreTraces).
//
// A checkpoint is due every Config.CheckpointEvery steps (a step is one batch applied and
// reported, by any worker) or every Config.CheckpointInterval of training time, whichever comes
// first once a step has been trained since the last, or when asked (Checkpoint). The barrier goes
// up; a worker finishes the batch in hand and may not begin another until the release; once no
// live worker holds a batch (one that does not finish within ArriveTimeout is fenced and evicted),
// the dispatcher and the ledger are snapshotted, every server copies its rows, dense tensors and
// applied positions into shared memory, the barrier comes down, and the snapshot is persisted and
// committed in the background, in step order. The dispatcher's clock stands still while the
// barrier is up, so the pause costs no worker its leases. A worker not heard from for
// WorkerSilence is failed.
//
// # Exactly once
//
// Each membership of a worker gets a fence epoch, incarnation<<32 | n, where incarnation counts
// the coordinators of the job: a coordinator restored from a commit runs as the next incarnation,
// so the floor incarnation<<32 voids every epoch an earlier one issued. A worker that is failed,
// leaves or joins again has its old epoch fenced on every server before its shards go back to the
// dispatcher; the servers refuse its pushes from then on (ps.ErrFenced). A worker name belongs to
// one live process: a second one that joins under it while the first trains is refused
// (ErrDuplicateWorker), and a restarted process gets the name back once the coordinator has failed
// the old one. Each push also carries its batch's data position, which a server applies at most
// once per slot (ps.At). So a batch a worker pushed halfway before it died or was cut off is
// replayed from the last reported offset by another worker and lands exactly on the servers that
// lacked it, and a Session may simply run a failed batch again. A position is a batch's exact
// record range, so every worker of a job must read with the same shard.ReaderConfig.BatchSize (a
// batch replayed with other boundaries would not be recognised and would land twice): the
// coordinator keeps the first joiner's in its commits and refuses a worker with another.
//
// The coordinator's ledger marks, in the same step as the dispatcher accepts a progress report,
// the dataset positions it newly covers (Coordinator.Service is the dispatcher as workers must
// reach it); it is saved and restored with every commit, and ExactlyOnce compares it with the
// dispatcher: every position of a finished epoch trained exactly once.
//
// # A parameter server fails
//
// Every server has an incarnation, new each time its process (or server.Server) starts. The
// coordinator asks each server for its health every HealthEvery; one that has not answered for
// ServerTimeout, one that answers as another incarnation (it restarted), one that cannot be
// fenced, and one reported by ServerFailed or replaced by ReplaceServer is failed; so is one a
// worker could not reach (a Session reports it: Suspect) or gossip declared failed (Observe) that
// does not answer a health call made at once. Once the coordinator has admitted an incarnation
// (ParameterServer.Admit), a restarted process refuses every call meant for the old one
// (ErrReplaced), and it has no owner table, so it serves nothing until it is restored. No barrier
// goes up while a server is failed, and a snapshot taken before the failure whose commit had not
// been written is abandoned, so no commit ever holds an unrecovered failure and retention never
// deletes the commit a recovery needs.
//
// The coordinator waits up to ReplaceWait for a new incarnation at the failed node (started by a
// scaler, or by hand); without one, the survivors take the failed slots under a new owner table (a
// rendezvous placement from the old one: only those slots move). Then, by Config.Recovery:
//
//   - Rollback (the default): workers are held, every epoch is fenced (a new incarnation), every
//     server clears its rows and loads its slots of the newest commit (from its own shared memory
//     where it still holds that commit), the dispatcher and the ledger return to the commit, and
//     only then do the workers join again, under the new incarnation: a worker that joined earlier
//     may hold a batch of a lease the dispatcher's restore voided, and is made to join again
//     before it trains it. Exactly-once holds; the work since the commit is redone.
//   - Partial: the other servers go on serving; the servers that take the failed slots (the
//     replacement, or survivors) load just those slots of the commit, the replacement is fenced
//     like the others, and the new table is published. The positions trained between the commit
//     and the publication lost their updates on those slots: RecoveryEvent.Lost lists them (they
//     count as trained). The batches in flight at the publication are voided: their workers are
//     failed and join again (their shards go back counting no failure: a shard is not at fault),
//     and the batches are trained again, so one that had reached the failed server and not yet
//     reported lands on the restored slots (the servers that applied it skip it) instead of being
//     lost unseen. Batches the commit restored already holds (applied before it and reported after
//     it: after a coordinator's takeover, or by a worker that died between its pushes and its
//     report) are not lost on the slots they reached: RecoveryEvent.Held lists them. The count
//     misses nothing when workers report every batch as it ends (shard.ReaderConfig.ReportEvery
//     1); otherwise a batch ended but not yet reported at the publication is missed.
//
// Meanwhile a Session retries a batch whose function failed for want of a server until
// ApplyTimeout, and one fenced by a rollback gives the batch up and joins again: no worker fails.
// Status.LastRecovery and Config.OnRecovery report each recovery.
//
// A commit that turns out damaged when a rollback, a resume or a takeover restores it (a chunk
// that fails its checksum on any server, an object missing) is moved aside (checkpoint's
// Quarantine) and the commit before it restored instead, in one process and across processes
// alike: RecoveryEvent.Skipped and Resumed.Skipped say which and why. A remote server's answer
// keeps the identity of every sentinel its error matches (checkpoint's, ps's and this package's),
// so the coordinator tells damage from a failure to reach it either way.
//
// # The coordinator fails
//
// A coordinator that restarts (local.Job.RestartCoordinator in process, a new process started by a
// scaler or by hand) calls Resume while the servers still train: it claims the job in storage (an
// exclusive create of its incarnation, so two coordinators never both commit), leads the servers
// as the new incarnation (they refuse the earlier coordinator's calls from then on, ErrSuperseded,
// and it stops), fences every earlier epoch, and either keeps the servers' rows (every server up
// under one table and no commit after the one restored) or returns them all to the newest commit.
// Servers forget only the data positions the newest commit covers, so the batches replayed after a
// takeover land exactly where they had not (a server's record of them is a watermark per data
// shard and the few batches above it, the size of what is in flight: see package ps). Workers'
// calls wait for the new coordinator and their sessions join it again.
//
// # Membership
//
// Gossip (package membership) tells each process the job's processes: each one's role, node id,
// incarnation, RPC address and host. Give the coordinator's process's events to
// Coordinator.Observe: gossip is a hint that makes the coordinator look at once, never a verdict:
// a server it declares failed is failed only if it does not answer a health call as the
// incarnation admitted, and a worker only if it has not been heard from for HealthEvery. Health
// checks, silence and lease expiry work without it.
//
// # Scaling and status
//
// A Scaler turns a Plan (how many servers and workers) into running processes and restarts those
// that crash (the contract is at Scaler; elastictest.TestScaler checks it): local.Scaler runs an
// in-process job's workers as goroutines, process.Scaler runs a binary once per role and node id.
// Coordinator.SetParallelism hands it a new plan (workers join while the others train; those
// beyond the plan leave, their shards going back at their reported offsets). A new number of
// servers is reached while training goes on (live repartition): a ServerScaler (local.Scaler, or
// process.Scaler given process.Config.Server) starts the new servers, the coordinator moves onto
// them, or off the highest-numbered ones, only the slots whose owner changes (ps.Migrator: each
// group of slots is copied while its owner serves it, then handed over under a short fence and a
// new owner table; bench repartition reports how short), and the drained servers are stopped.
// Every owner table change (a group handed over, a recovery) and every snapshot hold one lock, so
// a commit never mixes tables and no snapshot keeps slots fenced; a recovery moves only the failed
// servers' slots; a move that failed part of the way is finished by the next plan. A scheduler
// that starts and stops servers itself tells the coordinator (Coordinator.AddServers and
// RemoveServers; remote.Control's from another process). Coordinator.Rebalance moves the hottest
// slots off a server whose share of the load (measured from the servers' per-slot counters) is too
// high, the same way. Coordinator.Status tells the phase, the plan, the owner table version, every
// server and worker with its incarnation or epoch, last contact and batches, the data progress,
// the checkpoint and recovery figures; Usage adds every server's counters. remote.Control reaches
// them from another process.
//
// # Concurrency and ownership
//
// A Coordinator is safe for concurrent use (so are the backends: see each package); a Session is
// used by one goroutine at a time (Close from any). Config.JobState, CheckJob and OnCheckpoint are
// called from the coordinator's goroutines, OnCheckpoint one call at a time; OnProgress from a
// goroutine of its own, one call at a time. Close is idempotent
// and joins every goroutine; closing a Coordinator does not close its servers. A Batch belongs to
// the step's function until it returns.
package elastic
