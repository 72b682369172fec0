// Package elastic holds the control logic of an elastic training job: the coordinator that owns
// the owner table, the data-shard dispatcher, the checkpoint barrier and schedule, the commit
// queue and resume, and the fence epochs that make every batch count exactly once.
//
// # The barrier core
//
// The coordinator's protocol state is an I/O-free core: events (a worker joins, begins or ends a
// batch, arrives at a barrier, leaves, fails, a snapshot or commit finishes, the clock moves)
// go in, and actions (fence these epochs on every server, evict a worker from the dispatcher,
// pause, snapshot at a step, release, commit) come out, in the order the driver must carry
// them out. Its behaviour is pinned by the trace scripts in testdata (TestCoreTraces).
//
// A checkpoint is due every CheckpointEvery steps (a step is one batch applied and reported by
// any worker) or when asked. The barrier goes up; a worker finishes the batch in hand and may
// not begin another until the release; once no live worker holds a batch (a worker that does
// not get there within the arrive timeout is fenced and evicted), every server snapshots, the
// barrier comes down, and the snapshot is persisted and committed in the background, in step
// order.
//
// # Fence epochs
//
// Each worker membership gets a fence epoch, incarnation<<32 | n, where incarnation counts the
// coordinators of the job: a coordinator restored from a commit runs as the next incarnation,
// so the floor incarnation<<32 voids every epoch an earlier coordinator issued.
package elastic
