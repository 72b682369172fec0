// Package train is the DLRM trainer of examples/dlrm: the model, the data, evaluation and the
// figures, around the job control of package elastic. The command in examples/dlrm is flags,
// display and signals around Run; the benchmarks and tests call Run directly.
//
// # A run
//
// Run loads the data (the synthetic generator of package model, Criteo, libSVM or libFM files,
// or MovieLens ratings), checks that no test record is also a training record (Overlap: a test
// file that repeats training records is refused unless Config.AllowOverlap), and starts an
// embedded job with local.Start: the coordinator with
// its data-shard dispatcher, and Config.Servers parameter servers on loopback TCP with a fresh
// cluster secret, hosting one embedding table per sparse field ("emb.FIELD"). Every MLP tensor
// is created on the server that owns its name ("mlp.NAME", ps.Client.InitDense: the first caller
// wins). With Config.Resume the coordinator first restores the newest commit. Config.Workers
// workers then train, each through an elastic.Session.
//
// A worker step (Session.Step): the shard reader's next batch; the coordinator's barrier, if a
// checkpoint is under way; one pull per field table and per MLP tensor, in parallel; forward
// and backward (model.Model.ComputeGradients); one push per table and tensor, each carrying the
// worker's fence epoch and the batch's data position; the report of the batch to the
// dispatcher; and its end at the coordinator, which marks its positions in the exactly-once
// ledger. The servers apply the optimizers (asynchronous training: pushes are applied on
// arrival), each batch position at most once per slot, so a step that fails halfway is simply
// run again. A batch without records (text data whose shard ends in held-out or malformed
// lines) pushes nothing: it only reports its range.
//
// # Checkpoints
//
// Every Config.CheckpointEvery steps or Config.CheckpointInterval of training, whichever comes
// first, and once when the run ends, the coordinator raises its
// barrier: workers finish the batch in hand and wait; every server copies its rows, MLP tensors
// and applied positions into shared memory; the coordinator saves the dispatcher, the ledger
// and the run's description (data, model shape, samples trained) with it; training goes on, and
// the copy is persisted and committed in the background, in step order. The pause is reported
// as the blocking time. A periodic checkpoint whose servers are still persisting both their
// generations is skipped; the final one waits for them.
//
// A resume checks that the newest commit was taken by the same job (data, model shape, seeds),
// then loads every server's slots (from another number of servers too), the MLP tensors, the
// dispatcher's snapshot (every lease ends; shards resume at their reported offsets) and the
// ledger, and continues from that step. A fresh run deletes the job's earlier checkpoints in
// Config.CheckpointDir.
//
// The shared-memory tier lives in Config.ShmDir or a default directory chosen by free space; the
// choice is recorded in the checkpoint directory (file shm-dir), so a resume looks where the
// regions are, and a fresh run deletes every region of the job it finds there, including those
// of servers that a run with more servers left. The shared-memory directory names its checkpoint
// directory in turn (file dlrm/.owner), so a copy of a checkpoint directory, which carries the
// original's record, never takes the original's regions for its own. Regions are deleted when a run ends unless
// Config.KeepShm; kept or not, those of servers the run does not have go once it has committed
// a checkpoint of its own (until then a restore may read them).
//
// # Exactly once
//
// The coordinator's ledger is a bitmap of dataset positions per epoch, set as each batch ends
// applied and reported, independent of the dispatcher's bookkeeping, and saved and restored
// with every commit, so it always describes the training the model holds. The summary compares
// it with the dispatcher's accepted counts: every position of a finished epoch trained exactly
// once, and in the current epoch every position trained at most once and exactly those the
// dispatcher counted. Held-out and malformed lines are positions too. Run returns
// ErrNotExactlyOnce when the check fails.
//
// # Roles in separate processes
//
// RunServer, RunWorker and RunCoordinator run the same job as separate processes (see
// RoleConfig), with the same protocol as Run: a server serves its tables and the coordinator's
// control calls (remote.ServeServer) on its one port; the coordinator serves the dispatcher and
// the workers' control calls (remote.ServeControl) on its one port and drives the servers
// through remote.Server; a worker trains through an elastic.Session over an
// remote.Control. A worker not heard from for 30 seconds, or that does not reach a
// barrier in time, is fenced on every server and its shards go back to the dispatcher; the
// batch it may have left half applied is replayed by another worker, and the servers skip the
// part they already hold. A resume restores into parameter servers that have applied nothing
// since they started (restart every process; a server that holds trained rows refuses).
//
// # Concurrency and ownership
//
// Run may be called from several goroutines at once with different checkpoint directories;
// each run owns what it starts and stops and joins all of it before returning. Config.OnEvent
// is called from the run's goroutines, one call at a time. The Summary belongs to the caller.
package train
