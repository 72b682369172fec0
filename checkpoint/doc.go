// Package checkpoint implements flash checkpoints of parameter-server tables: a blocking copy into
// pre-faulted shared memory, background persistence to storage with checksums and compression,
// a two-phase job-level commit, incremental checkpoints, retention, and bit-exact restore onto any
// number of servers.
//
// The package imports nothing else of the project. It sees a table only through the Table
// interface (packed raw records out, records in), places rows by the slot of their id (embedding.Slot: xxhash64 of the id's 8
// little-endian bytes, mod S), and saves anything else that must be restored with the tables —
// dense parameters, the data-shard dispatcher's snapshot, the coordinator's state — as opaque
// named blobs in the same commit.
//
// # The flow
//
// Each parameter server runs a Checkpointer; the coordinator runs a Committer:
//
//	ck, _ := checkpoint.New(checkpoint.Config{Job: "ctr", Node: "ps-3", Tables: tables, Storage: st})
//	defer ck.Close()
//	ck.Reserve(ctx, expectedBytes)                  // fault in shared memory once, at start-up
//	...
//	ck.Snapshot(ctx, step, checkpoint.SnapshotSlots(owned), checkpoint.SnapshotBlob("dense", d))
//	ref, err := ck.WaitPersisted(ctx, step)         // sent to the coordinator
//	...
//	m.Commit(ctx, step, refsOfEveryNode, checkpoint.Blob{Name: "dispatcher", Data: s}) // coordinator
//
// Snapshot blocks only while the tables' rows are copied into shared memory (all rows, or for a
// delta only the rows changed since the previous checkpoint); training then goes on. Call it at a
// step barrier for a consistent checkpoint; otherwise each row is consistent. In the background a
// sealer checksums the copy and seals it, and a persister streams it to Storage; that work waits
// while a copy runs, of this Checkpointer or of any other sharing its Config.Gate (the servers of
// one process should share one), so it never takes the cores a blocking copy needs. Restore:
//
//	info, _ := m.Choose(ctx, verifyOnEveryNode)     // newest commit every node can read
//	ck.Load(ctx, info.Step, checkpoint.RestoreSlots(ownedNow))
//
// or, for a single node, ck.Restore(ctx), which picks the newest commit itself.
//
// # Shared-memory tier
//
// A node's region is the directory ShmDir/JOB/NODE (default /dev/shm/elasticps/JOB/NODE): a lock
// file held by the owning process (flock), extent files of two generations ("g0-N", "g1-N") that
// are fallocated (a full tmpfs fails cleanly instead of with SIGBUS later), mapped with every page
// faulted in once when created (MADV_POPULATE_WRITE on every CPU at once, then a load of each page,
// which a hypervisor that shadows page tables needs before the page can be written at memory
// speed), and never remapped; and one seal file per generation ("g0.seal", "g1.seal"). A
// generation holds a chain: a full snapshot followed by the deltas taken after it, appended behind
// it. Its seal lists each segment (job, node, step, slot set,
// base step, where each table's records lie, and for a ShardedTable's full copy the record count
// of each of its groups) with an xxhash64 per piece of whole records of at most 4 MiB, cut within
// each group (seal version 3, whose chains may change their slot set; regions sealed by versions
// 1 and 2 are still read), and is replaced as a whole by rename; a generation about to receive a
// new full snapshot loses its seal first. A crash at any point therefore leaves each generation
// sealed at some complete prefix of its chain.
//
// A full snapshot goes into the generation that does not hold the newest chain, and only if no
// seal or persist work on it is pending (else Snapshot returns ErrBusy and copies nothing). A delta
// is appended to the newest chain's generation, behind bytes the persister may still be reading; a
// snapshot never writes bytes a persist is reading. Appending deltas (rather than alternating
// generations on every snapshot) keeps a whole chain, base included, in one generation, so the
// newest commit can be restored from shared memory even when it is a delta; the price is that a
// generation holds the base plus up to FullEvery-1 deltas.
//
// An extent is created under a temporary name and renamed once it is reserved and mapped, and seals
// are written the same way; the owner removes temporary files, and extents no seal names that cannot
// be mapped, left by a process that died mid-way, when it opens the region.
//
// Shared memory grows when needed (Headroom sizes the growth), by adding extents; the sealer also
// grows it ahead of time — room for another delta as large as the largest seen, and room for the
// next full snapshot in the other generation — so faulting memory in stays off the blocking path.
// Reserve does it up front. A restarted process of the same node reattaches to its region in New.
//
// # Storage tier and the commit protocol
//
// Storage is a small interface (create-then-commit writer, open, list, delete) with an atomic,
// durable Commit; FSStorage (temporary file, fsync, rename, fsync of the directory), MemStorage and
// FaultStorage (failing chosen operations, short writes, a full disk, operations held mid-way) are
// provided, and CrashFS, a file system in memory to put under FSStorage (NewFSStorageOn) that keeps
// across Crash only the bytes and directory entries that were synced. The layout of a job in storage:
//
//	JOB/commits/STEP                      commit record (phase two, by the coordinator)
//	JOB/data/STEP/NODE/ID/manifest        a node's manifest (phase one ends by writing it)
//	JOB/data/STEP/NODE/ID/tT-sLO-pP       chunk: table T's records for a slot range, part P
//	JOB/data/STEP/NODE/ID/bI              a node's blob
//	JOB/data/STEP/_coordinator/ID/bI      a blob saved by Commit
//
// STEP has 20 digits; ID is unique per persist attempt, so nothing a commit points to is ever
// overwritten. Phase one: the persister partitions the records of a sealed snapshot by slot into
// chunks of about ChunkBytes (a slot range per chunk; a slot too large for one chunk is split in
// parts), drops rows of slots the node does not own, compresses each chunk (S2 by default, zstd or
// none; a chunk whose first 256 KiB do not shrink by an eighth is stored as it is, since trained
// float32 weights rarely compress and compressing them anyway would make persisting CPU-bound),
// frames it with an xxhash64, writes the chunks and blobs, and writes the manifest last. Phase two: the coordinator calls Commit with the
// manifests of every node (ManifestRef from WaitPersisted). Commit checks each manifest's checksum,
// that they agree on the job, step and slot count, that every slot has exactly one owner, and that
// every chunk and every delta's parent chain exists; then it writes its blobs and the commit record.
// Nothing without a commit record is ever restored.
//
// Incremental checkpoints: every FullEvery-th checkpoint is full; the others hold only the rows
// changed (and deletion records for rows removed) since the previous one, and point to it; restore
// applies the base and then the deltas in order. When a persist fails, the next persist of the same
// generation also carries the rows of the failed one (so the chain in storage has no hole), and a
// persist that cannot chain onto a durable predecessor is written as a full checkpoint.
//
// Changes of slot set (a live repartition): every snapshot and manifest records the slots its node
// owned, and a row of one element of a chain survives only if its slot is owned at every later
// one (in storage: kept by every later manifest, manifest version 2, which also covers a persist
// that carries several snapshots; version 1 manifests are still read). So after a node gains slots
// its next delta holds every row of those slots besides the ordinary changes, and after it loses
// slots it holds nothing for them — no deletion records — and restore drops their older rows; a
// slot lost and gained again comes back only through the whole copy of its rows taken when it was
// gained again. A delta leaves out the changes of slots its node does not own. This needs every
// table to be a SlotDeltaTable (embedding tables are); with a plain Table a snapshot whose slot set
// differs from the previous one's is taken in full. The first snapshot after a move then costs an
// ordinary delta plus the gained rows: with a third of a 256 MiB table's slots moved and 5% of the
// rows trained, 11x the bytes of the delta for a move in (a full snapshot was 30x) and 1.0x for a
// move out (was 20x). Training waits about 8x the delta for a move in (was 10x: finding the
// gained slots' rows reads every row, about half the memory traffic of a full copy) and 1.4x for
// a move out (was 12x); see BenchmarkSnapshotAfterMove.
//
// Retention (Committer.Prune, run after each Commit): keep the newest KeepLast commits and every
// commit whose sequence number is a multiple of KeepEvery, the one commit a program pinned
// (Committer.Pin, recorded in JOB/pinned: the best one of a run, say), and, once there is one, a fallback: a
// commit whose chains share no object with the newest commit's (the newest such, unless a kept
// commit already is one), so one corrupt byte in the newest chain — in its base, which every
// later delta needs — never leaves nothing to restore. In effect the previous full checkpoint and
// the deltas on it stay until a newer full one is committed and another commit on it. Commit
// records go first, then every object older than the newest commit that no kept or quarantined
// commit's chain needs. The newest commit, the bases and deltas a kept delta needs, and persists
// newer than the newest commit are never deleted.
//
// # Restore
//
// Verify and Load take a committed step; Restore tries commits newest first. Each old node's part
// comes from shared memory on this host when a sealed generation of that node's region (its own, or
// another node's region that no live process holds) holds exactly the committed chain — checked by
// segment ids recorded in the commit — and from storage otherwise; shared memory that fails its
// checksums falls back to storage. Each node loads only the slots it owns now (RestoreSlots), and
// of each element of a chain only the rows that survive to the committed step (see above): from
// storage it reads only the chunks whose slot range meets them; with another slot count S it reads
// every chunk and places rows by id. No table is changed by a checkpoint that fails its checks: a
// node's whole part is verified before it is loaded, except that the full base of a ShardedTable
// restored from shared memory into an empty table (one node's part, every row of it) is loaded
// group by group on every worker, each piece verified just before it is loaded, and a piece that
// fails undoes the whole load and sends that node's part to storage. A corrupt,
// truncated or uncommitted checkpoint fails Verify or Load with an error wrapping ErrCorrupt,
// ErrNotFound or ErrNotCommitted, and Restore and Committer.Choose log the reason and move to the
// previous commit; Committer.ChooseReport also returns the commits skipped, with the reasons (which
// name the object that failed), for the program to report and to move aside with
// Committer.Quarantine: a quarantined commit (JOB/quarantine/STEP-ID) is never restored, and
// retention keeps what it names, as evidence, until its directory is deleted. Retention
// quarantines unreadable commit records rather than deleting them. A restore that read some
// node's part from shared memory has not read the storage copy, so it verifies that copy in the
// background afterwards and reports the result (Config.OnStorageVerified; a damaged copy is
// logged as a warning).
//
// Committer.Clean, at a job's start, removes what no commit can restore: persists newer than the
// newest commit (a generation persisted but never committed) and the temporary files of writes a
// killed process left (Storage implementations that are a TempRemover). Several nodes must agree on one step: the coordinator calls Choose with a
// function that asks every node to Verify, then has every node Load the chosen step. Tables should
// be empty before a restore (rows the checkpoint does not hold are left alone); the next snapshot
// after a restore is full.
//
// A restore rolls a node back: the steps after the one loaded will be taken again, and snapshots
// still in the pipeline describe tables that are gone. So before Load or Restore changes a table it
// abandons every snapshot whose persist has not been reported (a persist in progress is cancelled and
// removes what it wrote; WaitPersisted reports a *PersistError wrapping ErrAbandoned; OnPersist is not
// called) and forgets the results of steps after the one loaded. Each snapshot carries its own
// result, so a step taken again yields only its new manifest, and nothing an abandoned persist does
// afterwards reaches the new chain.
//
// A failed persist (full disk, I/O error) is reported by WaitPersisted and OnPersist as a
// *PersistError, counted in Stats, logged, and removes what it wrote; earlier commits are untouched
// and snapshots go on. Close cancels a persist in progress the same way, and reports it and the
// snapshots not yet persisted as failed with ErrClosed.
//
// # Digests
//
// A Digest fingerprints a model, bit for bit, without moving it: per table its schema, its row
// count and a 128-bit sum over its rows of hashes of their raw records. The sum does not depend
// on the order of the rows, so the parts of a model that several servers hold digest separately
// and add up (Merge), and the same model on any number of servers has one digest.
// Committer.Digest reads a commit from storage and digests the rows a restore of it loads;
// TableDigest.Add digests a live table's raw records (a parameter server digests the slots it
// owns: ps.Server.Digest), so a job's model and a commit compare with one call (Digest.Equal,
// Compare, Diff).
//
// # Concurrency and ownership
//
// Checkpointer, Committer and the Storage implementations are safe for concurrent use; a
// Checkpointer runs Snapshot, Reserve, Verify, Load and Restore one at a time. Table must be safe
// for concurrent use (training goes on during CopyRaw); the Checkpointer never calls LoadRaw on one
// table from two goroutines at once. Slices passed in (blob data, slot lists) are copied or only
// read during the call; returned blobs belong to the caller. Close stops and joins the background
// goroutines and keeps the region's files for a later process; DeleteRegion removes them.
package checkpoint
