// Package embedding implements the embedding tables that parameter servers hold: maps from uint64
// feature ids to rows of Dim float32 weights, each with its optimizer state and metadata (the last
// step that touched it and how often it was updated).
//
// # Storage
//
// A Table is split into a power-of-two number of shards, each under its own RWMutex. A shard keeps
// its rows in chunks of 512 rows inside []uint32 slabs (viewed as float32 for the weights) and
// finds them through an open-addressing index of uint32 entries (row number and an 8-bit hash
// tag, linear probing). A single removal moves the later entries of its probe run back; a bulk
// removal (DeleteSlots) leaves tombstones, which inserts reuse and the next rebuild of the index
// drops, so that it reads no row but those it removes (unless it leaves a shard with few rows,
// whose index it then rebuilds from them). Nothing the garbage collector has to scan grows with
// the row count: a full GC of a table of millions of rows costs about as much as an empty one.
// Beyond the weights and optimizer state a row costs 16 header bytes (id, last step, frequency)
// and 5 to 7 bytes of index; MemoryBytes reports every byte, including unused capacity.
//
// Rows are created on first use. A new row's weights are a pure function of (Config.Seed, id,
// Config.Init), so the same id gets the same initial row on any server, and a row that was never
// updated need not be moved or saved anywhere.
//
// # Batches
//
// Lookup and Apply take a batch of ids. They hash every id once, group the batch by shard and take
// each shard's lock once per batch, so two goroutines working on different batches scale with the
// cores. Apply sums the gradients of repeated ids before one optimizer step per row and refuses a
// batch holding a NaN or infinite gradient without changing anything.
//
// # Admission and eviction
//
// Admission keeps rare ids out: AdmitCount creates a row once Lookup has seen the id MinCount
// times (counted in a fixed-size count-min sketch); AdmitProbability admits with a fixed chance.
// Until admitted, Lookup returns the id's initial value and Apply drops its gradient. Eviction
// removes rows untouched for Eviction.TTL steps (EvictExpired) and keeps the row count under
// Eviction.MaxRows by evicting a sampled LFU or LRU victim before each insert beyond the cap. An
// evicted id comes back with its initial value.
//
// # Moving rows
//
// Raw records are the rows' own bytes (little-endian): id, last step, frequency, weights, state.
// CopyRaw copies all rows, or only those changed since the last base copy, in one consistent cut;
// LoadRaw applies records bit-exactly. Together with Schema they are what the checkpoint package
// needs. CopyRawDelta is the incremental copy of a server whose slots changed: the changes of some
// slots, and every row of others (the slots it gained), in one cut; CopyRawSlots copies the rows of
// some slots. Both need room only for what they copy. Export and Import wrap the same records in a versioned stream with per-block and
// whole-stream xxhash64 checksums, selected by slot (Slot, SlotSet) and optionally only the rows
// a Tracker saw change; they are what live migration of slots needs. Import verifies the whole
// stream before it changes anything.
//
// # Concurrency and ownership
//
// Every method of Table and Tracker is safe for concurrent use. Slices passed in (ids, dst, grads,
// src) are only read or written during the call and never retained. Slices in a RowView alias the
// table and are valid only inside the Range callback; RowData holds copies.
package embedding
