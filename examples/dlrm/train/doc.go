// Package train is the orchestration of the DLRM trainer in examples/dlrm: it runs a training
// job on an embedded cluster — parameter servers and the data-shard dispatcher serving on
// loopback TCP with a cluster secret, and workers — with flash checkpoints, resume, exact
// evaluation and an exactly-once check. The command in examples/dlrm is flags, display and
// signals around Run; the benchmarks and tests call Run directly.
//
// # A run
//
// Run loads the data (the synthetic generator of package model, Criteo or libSVM files, or a
// MovieLens directory), starts Config.Servers servers hosting one embedding table per sparse
// field ("emb.FIELD"), creates every MLP tensor on the server that owns its name ("mlp.NAME",
// ps.Client.InitDense: the first caller wins), starts the dispatcher, opens one checkpoint.
// Checkpointer per server and a checkpoint.Committer, restores the newest commit when asked,
// and starts Config.Workers workers.
//
// A worker step: the shard reader's next batch; one pull per field table and per MLP tensor, in
// parallel; forward and backward (model.ComputeGradients); then, through the gate, one push per
// table and tensor and the reader's Done, which reports the batch's progress to the dispatcher;
// and a mark in the ledger. The servers apply the optimizers (asynchronous training: pushes are
// applied on arrival). A batch without records (text data whose shard ends in held-out or
// malformed lines) is a step with no pull or push: it only reports its range and marks it.
//
// # Checkpoints
//
// Every Config.CheckpointEvery steps, and once when the run ends, the coordinator closes the
// gate: it waits for the batches being applied to finish (pushed and reported) and holds new
// ones back, so the model holds exactly the progress the dispatcher accepted. It then
// snapshots every server (its embedding rows for the slots it owns, and its MLP tensors as a
// blob), the dispatcher (Dispatcher.Snapshot), the ledger and a description of the run, and
// reopens the gate; training waits only that long (reported as the blocking time). The
// dispatcher's clock stands still meanwhile, so the pause costs no worker its leases.
// Persisting to storage and the job-level commit follow in the background, one commit at a
// time, in step order (retention runs after each). Training never waits for storage: a
// periodic snapshot is skipped when a server's two generations are both still being persisted
// (checkpoint.ErrBusy) or when 64 snapshots already wait for their commit. The final
// checkpoint is never skipped for that: it waits for the persists and for room.
//
// A worker whose push or report fails while it applies a batch breaks the gate before leaving
// it: the model may hold part of a batch the dispatcher did not count (or, when only the answer
// to the report was lost, one it counted without the ledger), so no checkpoint is taken after
// that, the run stops and Run returns the worker's error, which wraps ErrPartialApply. The
// last committed checkpoint is consistent; resume from it.
//
// The MLP tensors travel as blobs rather than as checkpointed tables because the checkpoint
// package places rows by the slot of their id, while a dense tensor lives whole on the owner of
// the slot of its name. A blob carries the tensor's raw rows (weights and optimizer state) and
// what is needed to recreate it; a restore recreates each tensor on its current owner and loads
// the rows bit-exactly, so a resume may use another number of servers.
//
// A resume (Config.Resume) picks the newest commit every server verifies, checks that it was
// taken by the same job (data, model shape, seeds), loads every server's slots, the MLP
// tensors, the dispatcher's snapshot (every lease ends; shards resume at their accepted
// offsets) and the ledger, and continues from that step. A fresh run deletes the job's
// earlier checkpoints in Config.CheckpointDir.
//
// The shared-memory tier lives in Config.ShmDir or a default directory chosen by free space; the
// choice is recorded in the checkpoint directory (file shm-dir), so a resume looks where the
// regions are, and a fresh run deletes every region of the job it finds there, including those
// of servers that a run with more servers left. Regions are deleted when a run ends unless
// Config.KeepShm; kept or not, those of servers the run does not have go once it has committed
// a checkpoint of its own (until then a restore may read them). A run that cannot open every
// server's checkpointer deletes the regions it created.
//
// # Exactly once
//
// The ledger is a bitmap of dataset positions per epoch, set by the workers after each batch is
// applied and reported, independent of the dispatcher's bookkeeping, and saved and restored
// with every checkpoint, so it always describes the training the model holds. The summary
// compares it with the dispatcher's accepted counts: every position of a finished epoch
// trained exactly once, and in the current epoch every position trained at most once and
// exactly those the dispatcher counted. Held-out and malformed lines are positions too: they
// reach a worker inside a batch (or as a batch without records) and are marked with it. Run
// returns ErrNotExactlyOnce when the check fails.
//
// # Roles in separate processes
//
// RunServer, RunWorker and RunCoordinator run the same job as separate processes (see
// RoleConfig). Checkpoints there use a barrier instead of a shared gate: each worker keeps its
// own gate closed until it has registered with the coordinator, long-polls it, and at a
// barrier closes the gate and says it arrived; the coordinator snapshots once every registered
// worker has arrived, then releases them. A worker that loses touch with the coordinator closes
// its gate until it has registered again, and the coordinator stops waiting for a worker it
// has not heard from for a few seconds (a crash), so one dead worker does not stall every
// checkpoint. A worker whose batch fails while applied tells the coordinator, which then takes
// no checkpoint and stops the job (ErrPartialApply). Commits are serialised as in the embedded
// mode. A resume restores into parameter servers that have applied nothing since they started
// (restart every process; a server that holds trained rows refuses the restore).
//
// The parameter servers do not fence pushes, so the barrier rests on time: a worker that is
// cut off from the coordinator (not from the servers) while it is in the middle of applying a
// batch can put part of that batch into a checkpoint taken without it, and so can a worker that
// dies in the middle of its pushes. Within one process (Run) neither can happen.
//
// # Concurrency and ownership
//
// Run may be called from several goroutines at once with different checkpoint directories;
// each run owns what it starts and stops and joins all of it before returning. Config.OnEvent
// is called from the run's goroutines, one call at a time. The Summary belongs to the caller.
package train
