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
// applied on arrival).
//
// # Checkpoints
//
// Every Config.CheckpointEvery steps, and once when the run ends, the coordinator closes the
// gate: it waits for the batches being applied to finish (pushed and reported) and holds new
// ones back, so the model holds exactly the progress the dispatcher accepted. It then
// snapshots every server (its embedding rows for the slots it owns, and its MLP tensors as a
// blob), the dispatcher (Dispatcher.Snapshot), the ledger and a description of the run, and
// reopens the gate; training waits only that long (reported as the blocking time). Persisting
// to storage and the job-level commit follow in the background, in step order. A snapshot
// taken while the previous one is still being persisted may be skipped (checkpoint.ErrBusy).
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
// # Exactly once
//
// The ledger is a bitmap of dataset positions per epoch, set by the workers after each batch is
// applied and reported, independent of the dispatcher's bookkeeping, and saved and restored
// with every checkpoint, so it always describes the training the model holds. The summary
// compares it with the dispatcher's accepted counts: every position of a finished epoch
// trained exactly once, and in the current epoch every position trained at most once and
// exactly those the dispatcher counted. Run returns ErrNotExactlyOnce when that fails.
//
// # Concurrency and ownership
//
// Run may be called from several goroutines at once with different checkpoint directories;
// each run owns what it starts and stops and joins all of it before returning. Config.OnEvent
// is called from the run's goroutines, one call at a time. The Summary belongs to the caller.
package train
