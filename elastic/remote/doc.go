// Package remote carries the elastic protocol between processes: the calls the coordinator
// makes of a parameter server, and the calls workers, operators and autoscalers make of the
// coordinator, over each process's one authenticated RPC port (internal/rpc: the cluster
// secret, or mutual TLS). Package elastic holds the protocol; this package is its RPC
// transport, as a database/sql driver is to database/sql.
//
// # Two sides, two stubs
//
//   - ServeServer registers a server.Server's side on its process's ps.Server, and a Server
//     is the coordinator's elastic.ParameterServer for it: the coordinator of a job of
//     several processes drives every parameter server through one (elastic.Config.Servers,
//     or ServerAt for servers a scheduler starts later). It is an elastic.Digester too
//     (Coordinator.Digest asks every server for the digest of its slots).
//   - ServeControl registers the coordinator's side on its process's RPC server (the
//     dispatcher's shardnet.Server, say), and a Control reaches it: a worker's Session uses
//     it as its elastic.Control, an operator's command reads Status and changes the plan
//     (SetParallelism, SetPlan, AddServers, RemoveServers, Rebalance), and an autoscaler
//     drives the job through it (it is an autoscale.Job, with the Fail that replaces a
//     worker).
//
// A Server's calls are made for the incarnation the coordinator admitted (Admit) and as the
// coordinator incarnation that led it (Lead): a restarted server process refuses calls meant
// for the old one (elastic.ErrReplaced), and a server refuses a coordinator superseded by a
// later one (elastic.ErrSuperseded). A Control's worker calls (Join, Begin, End, Leave) wait
// out a coordinator that cannot be reached, trying again until their context ends; its other
// calls are made once, and fail with an error wrapping elastic.ErrUnavailable when the
// coordinator could not be reached.
//
// # Errors and the wire
//
// A handler's error crosses the wire with the identity of every sentinel it matches, of
// packages checkpoint, elastic, ps, shard and server (errors.go holds the table of codes): a
// caller tests the error it gets with errors.Is as it would in one process, and its text names
// the address called. The method ids are 0x45xx ('E'), the payloads fixed fields whose
// decoders check every length before they allocate (wire.go). A field added to a request or
// an answer comes last and is optional, so that processes of the previous release and of
// this one understand each other (Health's Restoring, Rebalance's moves).
//
// # Concurrency and ownership
//
// Server and Control are safe for concurrent use; Close closes their connections, is
// idempotent, and a call made after it fails. Slices given to a call (Fence's epochs,
// AddServers' nodes, RemoveServers' ids) are encoded before it returns and not kept; what a
// call returns (a Status, an owner table, the moves of a Rebalance) belongs to the caller.
// ServeServer and ServeControl keep the server.Server and the coordinator for as long as the
// RPC server they registered on serves; closing that RPC server is the owner's.
package remote
