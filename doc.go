// Package elasticps is an embeddable library for elastic parameter-server training of
// recommendation models such as DLRM: embedding tables live on parameter servers (PS), workers
// pull rows, compute gradients and push them back, and servers and workers may join, leave, fail
// and be resized while training runs.
//
// This package holds only documentation; the library is in its sub-packages. The coordinator
// (package elastic) drives a job's barrier, checkpoints, commits, resume and fencing, recovers
// from the failure of a worker, a parameter server or itself, changes the number of servers
// while training runs (live repartition: only the slots whose owner changes move), and runs
// the job's processes through scalers; package elastic/autoscale recommends and applies the
// job's resources from what it measures.
//
// # The flow of a training job
//
// A job's embedding rows are spread over the servers by slot: slot = xxhash64(id) mod S, with S
// fixed per job (default 4096) and a versioned owner table mapping slots to servers. Each server
// keeps its rows in embedding.Table values:
//
//	tab, err := embedding.New(embedding.Config{Dim: 64, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}})
//	...
//	err = tab.Lookup(ids, weights)     // a worker's pull: rows are created on first use
//	err = tab.Apply(ids, grads, step)  // a worker's push: one optimizer step per row
//
// A row's initial value is a pure function of the table seed and the id, so a row nobody updated
// never has to be moved or saved. Rows move between servers, and to and from checkpoints, as raw
// records selected by slot (Table.Export, Table.CopyRaw), optionally only those changed since a
// mark (embedding.Tracker).
//
// Parameter servers (package ps) host the tables and serve pulls and pushes over authenticated,
// multiplexed TCP connections. A worker's ps.Client routes each id by its cached owner table,
// folds repeated ids, talks to every server in parallel, and when a server answers that it no
// longer owns a slot, fetches a newer table and resends only that part:
//
//	cli, err := ps.NewClient(ps.ClientConfig{Secret: secret, Servers: addrs})
//	err = cli.Pull(ctx, "user", ids, rows)
//	err = cli.Push(ctx, "user", ids, grads, step, ps.At(position))
//
// Every push carries the worker's fence epoch, and a batch's data position: a server refuses a
// fenced epoch and applies a position at most once per slot, so a batch that a dying worker
// pushed halfway is either replayed onto exactly the servers that lack it or not at all.
//
// Workers do not own a fixed slice of the data. The coordinator runs a shard.Dispatcher that
// leases shards of the dataset to whoever asks (shardnet serves it over the network), and each
// worker's shard.Reader reports the record offset it has trained through; when a worker dies
// or its lease expires, its shard goes back to the queue starting at that offset, so every record
// of an epoch is trained exactly once:
//
//	rd, err := shard.NewReader(shard.ReaderConfig{Service: dispatcher, Worker: "w-0", Source: src})
//	for {
//		b, err := rd.Next(ctx) // a batch of records; io.EOF when the job is done
//		...                    // pull, compute, push
//		rd.Done(ctx, b)        // progress: the batch is trained
//	}
//
// A flash checkpoint pauses training only for a memory copy: at a step boundary every server's
// checkpoint.Checkpointer copies its tables' rows into pre-faulted shared memory (all rows, or
// only those changed since the last full one), the dispatcher's snapshot goes along as a blob,
// and training resumes while the copy is checksummed, persisted to storage and committed by the
// coordinator once every server's part is durable. A restore loads the newest commit, from shared
// memory when the host still has it, onto any number of servers, each taking the slots it owns.
//
// Package elastic puts these together as a training program needs them: the Coordinator owns the
// owner table, the dispatcher, the fence epochs, the checkpoint barrier, the commits and resume,
// and a worker trains through a Session; one protocol runs in one process or across many:
//
//	job, err := local.Start(ctx, local.Config{Job: "ctr", Servers: 2, Tables: specs,
//		Coordinator: elastic.Config{Storage: store, CheckpointEvery: 1000, Dispatcher: data}})
//	s, err := job.NewSession("worker-0", shard.ReaderConfig{Source: src, BatchSize: 512})
//	for {
//		err := s.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
//			...                                  // b.Pull, compute, b.Push
//		})
//		if errors.Is(err, io.EOF) { break }      // the data is done
//	}
//	step, err := job.Coordinator().Checkpoint(ctx)  // and later: job.Coordinator().Resume(ctx)
//	live, err := job.Digest(ctx)                    // the model, bit for bit, training held
//	saved, err := job.DigestCommit(ctx, step)       // live.Equal(saved): on any server count
//
// A dense tensor declared with its initial value (ps.TableSpec.Initial) needs no worker to set
// it; elastic.Config.OnProgress hears every step, checkpoint, move and recovery, and
// elastic.Coordinator.WaitStep waits for a step. The Example of package elastic does the whole
// task in one process (a table and a tensor, checkpoints while training, 2 -> 3 -> 2 servers,
// a restore onto three checked by digest); examples/dlrm trains a DLRM this way.
//
// # Packages
//
//	embedding           pointer-free embedding tables with optimizers, admission and eviction
//	ps                  parameter servers and clients, owner tables, live migration, per-slot stats
//	shard               the data-shard dispatcher, its worker-side reader and data parsers
//	checkpoint          flash checkpoints: shared memory, storage, two-phase commit, restore
//	elastic             the protocol: the coordinator, worker sessions, fence epochs, recovery,
//	                    live repartition, status; the interfaces of servers and scalers
//	elastic/server      a parameter server's side of the protocol (checkpoints, fences, restores)
//	elastic/remote      the protocol across processes: serve a server or the coordinator, reach them
//	elastic/local       a whole job in one process, and a scaler of goroutine workers
//	elastic/process     a scaler that runs the job's processes on this host (os/exec)
//	elastic/membership  gossip membership of a job's processes (hashicorp/memberlist)
//	elastic/autoscale   resource recommendation and the runner that applies it
//	elastic/elastictest a job on the in-memory network, fault injection, a fake clock, the
//	                    scaler conformance test
//
// Each package's doc.go is its manual; the benchmarks live in examples/bench, the DLRM trainer in
// examples/dlrm and the trace-driven cluster simulator in examples/clustersim.
package elasticps
