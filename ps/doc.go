// Package ps implements parameter servers and their clients.
//
// # Placement
//
// A feature id belongs to slot embedding.Slot(id, S) = xxhash64(id) mod S, where S is fixed per
// job (DefaultSlots, 4096). An OwnerTable maps every slot to one server and carries a version.
// NewOwnerTable fills it by weighted rendezvous hashing with a load bound: no server holds more
// than LoadBound (1.1) times its weighted share, and given the previous table, only the slots
// whose top choice is a new server, the slots of departed servers, and what the bound forces,
// change owner. Going from n to n+1 servers moves about S/(n+1) slots; removing a server moves
// only its slots. A dense tensor lives on the owner of the slot of its name (OwnerTable.NameSlot).
//
// # Servers
//
// A Server hosts named embedding tables (each with its own dimension, optimizer, initialiser,
// admission and eviction) and dense tensors, and serves Pull, Push, PullDense, PushDense,
// InitDense and Stats over the internal RPC layer: length-prefixed frames over persistent,
// multiplexed, mutually authenticated connections (the cluster secret never crosses the wire;
// every frame carries a tag under per-connection keys, so nothing on the path can inject, alter,
// replay or reorder a request; ServerConfig.Protection adds encryption), with float payloads as
// raw little-endian bytes. A server refuses any request that touches a
// slot it does not own with a *WrongOwnerError carrying its owner-table version; requests hold the
// ownership state for reading while they run, so a new table takes effect between requests and a
// server never serves a slot it does not own. Stats reports rows, bytes, accesses and serving
// time per slot, so hot slots and hot servers can be found. Digest fingerprints the rows of the
// slots a server owns (a checkpoint.Digest): the servers' parts add up to the job's model,
// whatever their number.
//
// # Moving slots while training runs
//
// A slot migrates from its owner A to a server B without stopping either: B copies the slot's
// rows (weights, optimizer state, dense tensors) straight from A in chunks while A serves them
// and tracks their changes (embedding.Tracker, made before the first copy), catches up in
// rounds, and then, in a short handover, A fences the slots (every request touching them is
// refused with a *MovedError naming B; clients wait for the next table within
// ClientConfig.FenceWait), B copies the last changes and A's applied positions, and the next
// owner table gives the slots to B; A then drops its rows (embedding.Table.DeleteSlots), so a
// slot that comes back never revives stale rows. Server.ReceiveSlots is B's side, Migrator
// drives whole placements (only the slots whose owner changes, in groups, several at once,
// with a bandwidth cap, an owner table per group: OwnerTable.WithMoves) and PlanRebalance
// chooses moves that take load off a hot server. A server owns a slot only from the table
// that gave it, and refuses requests routed by an older one, so ownership is exclusive at
// every instant. A migration nobody uses ends by itself (ServerConfig.MigrationTTL), one whose
// slots a table gave away is released, and AbortMigrations ends them all (a new coordinator
// calls it). On synchronous servers each handover happens between two steps: the Migrator
// holds every server at a step boundary (pushes of later steps wait), hands the slots over,
// publishes the table and lets the waiting pushes in, refusing those routed by the old table
// whole so that their workers resend the step by the new one. A synchronous job's rows after a
// repartition are bit for bit those of the same training without one.
//
// # Fenced, exactly-once pushes
//
// A worker's client carries a fence epoch (Client.SetEpoch), issued by the job's coordinator
// when the worker joins, and each push may carry its batch's data position (At). A server
// refuses pushes of a fenced epoch (Fence, SetEpochFloor) with ErrFenced; Fence returns only
// after the pushes of that epoch being applied have finished. A server applies a position at
// most once per slot, so a resend (the client resends positioned pushes after a lost connection)
// or a replay of a batch whose worker died halfway through its pushes lands only where it had
// not. A shard's batches arrive in order (see Position), so the record of what was applied is,
// per table and data shard, a watermark below which every batch is done and the few batches
// above it with the slots each reached: its size follows what is in flight, not the batches
// applied. It is part of a server's checkpoint (AppliedState, LoadApplied, merged onto any
// number of servers); the coordinator folds the dispatcher's progress into it and prunes what a
// commit covers at each checkpoint (FoldApplied, PruneApplied), and slots restored from a commit
// while the job goes on keep that commit's watermarks (RestoreApplied, SettleApplied).
//
// # Dense tensors
//
// A dense tensor (an MLP weight matrix) is a table of rows of up to 1024 floats whose ids lie in
// the slot of its name, so it lives whole on that slot's owner and checkpoints and restores
// place it with its name. Declared ones (TableSpec.Dense) are created with the server, holding
// their initial value if it is declared too (TableSpec.Initial), and checkpointed
// (CheckpointTables); InitDense gives a tensor its first values (the first caller wins, and a
// restored tensor keeps its own) or creates an undeclared one, unless the server's tables are
// fixed (ServerConfig.DeclaredIn).
//
// Training is asynchronous by default: every push is applied on arrival. With
// ServerConfig.SyncWorkers the servers hold each step's pushes until every worker has pushed it
// and apply them in worker order; a push returns once its step is applied, so results do not
// depend on timing (for deterministic tests).
//
// # Clients
//
// A Client routes by its cached owner table, folds repeated ids of a batch into one (summing
// their gradients on push), sends each server its part in parallel (at most Parallel at once),
// and reassembles rows in the caller's order. A server's wrong-owner answer makes the client
// fetch a newer table from its Resolver and resend only that server's part, so a stale client is
// never wrong, only briefly slower. Context deadlines and cancellation are honoured. An error
// names the failing server (*ServerError); a push is never reported as success unless every
// part was applied, and a push that failed after some servers applied their parts says so
// (ErrPartialPush). A push with a NaN or infinite gradient is refused before anything is sent.
//
// Server.Register adds the control calls of package elastic to the server's one authenticated
// port.
//
// # Concurrency and ownership
//
// Server, Client, OwnerTable and TableHolder are safe for concurrent use; an OwnerTable is
// immutable. Slices passed to Client methods are read or written only during the call.
//
// Package pstest runs whole clusters in memory, with fault injection, for tests.
package ps
