// Package shard is the data-shard dispatcher of elasticps and its worker side: it splits a
// dataset into shards, leases them to workers, tracks how far each worker has trained, and
// makes every record count as trained exactly once per epoch across worker joins, leaves,
// crashes, stalls and coordinator restarts.
//
// # Pieces
//
// The coordinator runs a Dispatcher (New). Workers talk to it through the Service interface
// and its optional combined call, ReportAcquirer: the Dispatcher implements both in process, and
// package shardnet serves them over the network (shardnet.Server) and implements them on
// workers (shardnet.Client), with the codecs of package shardwire. On a worker, a Reader
// acquires shards over the Service, reads their records through a Source (IndexedSource for
// in-memory data, TextSource for text files cut by SplitText, or an application's stream
// source), hands batches to the training loop (Next) and reports progress as batches are
// trained (Done): every position it reports lies in a batch passed to Done, skipped lines
// included (a batch of only skipped lines has no records). Parsers turn text lines into
// Records: Criteo (TSV), LibSVM (plain libSVM, one field or the fields of a FieldMap), LibFM
// (field-aware libFM) and MovieLensRatings (MovieLens CSV joined with its movies), all reading
// labels by ParseLabel (0/1 and -1/+1 alike) and refusing NaN and infinite values;
// LoadMovieLens holds a MovieLens set in memory as an Indexed data set. A BadLines shared by a
// job's TextSources counts the malformed lines per file, each once, with the first few by file
// and line, and stops the reading when there are too many.
//
// # Datasets and shards
//
// An indexed dataset (IndexedDataset) of N records is cut into index ranges of Config.ShardSize.
// A text dataset (TextDataset) is a list of files cut by SplitText into byte ranges at line
// boundaries, RecordsPerShard lines each, never across files. A stream (StreamDataset) has
// partitions of offsets that grow by GrowStream; full shards are cut as offsets arrive, tails by
// FlushStream or SealStream.
//
// The records of a shard are numbered by their offset 0..Records-1 in the shard's visiting
// order: the natural order, or, with Config.ShuffleRecords, RecordOrder(lease.ShuffleSeed,
// Records). Progress is one number per shard: the offset through which records are trained.
// Using record offsets (not bytes) for every kind keeps the dispatcher format-agnostic; a
// text reader resuming at offset k skips k lines of its range.
//
// # Lifecycle
//
// Within an epoch a shard moves TODO -> DOING -> DONE. Acquire takes a TODO shard (shards
// handed back first, then the epoch's order, seeded per epoch when Config.Shuffle is set) and
// leases it to the worker until a deadline LeaseTTL ahead; every accepted Report moves the
// deadline again. When the lease expires, the worker is evicted (Evict) or leaves (Leave), or
// the worker asks for more than MaxLeasesPerWorker shards (it restarted and forgot them), the
// shard goes back to TODO at its accepted offset. Loss by expiry, eviction or the lease limit
// counts a failure; a shard that fails MaxFailures times in an epoch goes to FAILED and is
// listed in Progress.Failed (and logged), never dropped silently. A coordinator that declares a
// worker dead notes Granted and evicts later with EvictGranted: what the worker took after
// joining again under the same name stays with it, and an eviction that is no shard's fault
// can count no failure. An epoch ends when every shard is DONE or FAILED, and the next starts
// then (an epoch barrier: Acquire answers a *WaitError meanwhile); after the last, Acquire
// returns ErrNoMoreWork. A worker told to wait need not wait the whole WaitError.RetryAfter: a
// Service that implements the optional ShardAwaiter (the Dispatcher does) wakes it as soon as
// a shard can be leased or the work is finished, and the Reader waits on it when it can.
//
// # Fencing
//
// A lease id is (Incarnation, Seq, Shard). Seq grows by one with every grant and is never
// reused by a dispatcher instance, Restore included; Incarnation differs between instances
// (random by default), so ids granted before a coordinator restart are unknown after it. A
// Report(worker, id, offset, done) is accepted only if, when the dispatcher handles it:
//
//   - id.Incarnation is this dispatcher's, and shard id.Shard is DOING with current lease Seq
//     id.Seq held by worker, and
//   - the lease's deadline has not passed (expiry is processed before every call, so a late
//     report finds its lease already revoked), and
//   - 0 <= offset <= Records, and offset == Records if done is set (else ErrBadOffset, with no
//     other effect).
//
// Any other report returns ErrStaleLease and changes nothing but a counter. An accepted report
// with an offset at or below the accepted one only renews the lease (retries are harmless).
//
// # One call per shard
//
// A worker that reaches the end of a shard reports it done and wants the next: ReportAndAcquire
// (the optional interface ReportAcquirer) does both in one call, halving the round trips per
// shard when shards are small. It is Report(done) followed, if the report is accepted, by
// Acquire, under one lock. A report rejected as stale or out of range makes the whole call a
// no-op (no lease is granted); ErrNoMoreWork or a *WaitError after it mean the report was
// accepted and no shard was free. A repeat after a lost answer is safe: the dispatcher remembers
// each worker's last finished lease and the lease the finishing call granted, so a repeat counts
// nothing and returns that same lease while the worker holds it, instead of granting a second
// one the worker would never learn of (which would only be freed by expiry or the lease limit,
// counting failures). The Reader uses the combined call whenever it needs the next shard at the
// moment it finishes one, and falls back to two calls when the Service lacks it
// (errors.ErrUnsupported).
//
// # Exactly once
//
// A record (a position of a shard in an epoch) counts as trained when a report covering it is
// accepted: an accepted report on a shard with accepted offset a and reported offset o > a
// covers positions [a, o) and sets the accepted offset to o. Because a shard has at most one
// current lease, accepted offsets only grow within an epoch, and a lease once ended is never
// accepted again, every position of every shard is covered by at most one accepted report per
// epoch; and because a shard leaves DOING only as DONE (all positions covered), FAILED (listed
// with its offset) or TODO (handed out again from its accepted offset), every position of an
// ended epoch is covered exactly once or belongs to the tail of a FAILED shard. The package's
// tests check this with a ledger of accepted reports (shardtest.Ledger) while workers crash,
// stall, come back as zombies, lose the answers of their calls (combined ones included) and
// retry them, and the dispatcher is restored from snapshots. The combined call does not change
// the argument: its report part is an ordinary report, and a repeat accepts nothing.
//
// Records a worker trained but had not reported when it lost its lease are trained again by the
// next holder: a worker must call Reader.Done only after a batch's updates are applied, and the
// dispatcher fences reports, not updates. A worker that stalls past its lease and then pushes
// updates has put them in the model although they do not count; keep LeaseTTL well above the
// time between reports (ReportEvery batches).
//
// # Checkpoints
//
// Snapshot encodes the whole dispatcher state (versioned, xxhash64-checksummed) for the
// checkpoint commit; Restore loads it into a dispatcher built with the same dataset, shard size,
// seed and shuffle settings (Epochs may grow). Take the snapshot when the model holds exactly the
// reported progress: at the checkpoint barrier, after workers have reported every applied batch
// and before they apply more. Restore ends every lease: DOING shards go back to TODO at the
// offset accepted when the snapshot was taken, so training resumes exactly there, and the
// records reported after the snapshot (and lost with the model state of that time) are replayed
// once. After Restore, Progress.Partitions tells a stream where to resume GrowStream.
//
// # Over the network
//
// The coordinator serves its Dispatcher with a shardnet.Server on a listener; each worker gives
// its Reader a shardnet.Client for the coordinator's address. Calls are authenticated by the
// cluster secret, and the dispatcher's errors arrive on the worker as the same sentinels
// (errors.Is(err, ErrStaleLease) holds on both sides). A call without an answer (dispatcher
// down, partition, timeout) is an error the Reader retries with backoff (ReaderConfig.Backoff,
// MaxRetries); errors matching ErrPermanent (a wrong secret, a peer that is not a dispatcher, a
// closed client) end the Reader's call at once. Over a network the combined call matters most:
// a shard costs one round trip instead of two.
//
// A coordinator that crashes is replaced by a process that restores the last committed
// snapshot into a new Dispatcher (a new incarnation) and serves it on the same address (or
// clients move with shardnet.Client.SetAddr). Readers retry through the outage; afterwards their
// reports on old leases return ErrStaleLease, so they drop those shards and acquire again from
// the snapshot's offsets, and exactly-once holds as described above. Package shardnet's tests
// run readers through a coordinator crash, a restore and a partition on an in-memory network
// and check the ledger.
//
// # Concurrency and ownership
//
// A Dispatcher is safe for concurrent use; it starts no goroutines and does no I/O (time comes
// from Config.Clock; leases expire when a call, or Expire, finds them overdue). A Reader's Next
// must be called from one goroutine at a time, Done and Stats from any. Parsers, sources and
// MovieLens are safe for concurrent use; a Cursor, a Record and a Batch are not.
//
// New copies the slices of its Config. Leases, Progress, snapshots and everything returned by
// SplitText belong to the caller. A Batch belongs to the caller of Next until it is passed to
// Done, after which the reader reuses its slices; a Record is reused by each Cursor.Next.
package shard
