// Package server is the parameter server's side of the elastic protocol: a Server wraps a
// ps.Server, which serves the workers' pulls and pushes, with the flash checkpointer
// (package checkpoint) that snapshots its rows into shared memory and persists them, and
// carries out what the coordinator asks of a parameter server (elastic.ParameterServer):
// install an owner table, fence worker epochs, snapshot, persist and verify a checkpoint, load
// or restore slots from a commit, answer health checks.
//
// In one process (package elastic/local) the coordinator calls a Server directly; in a job of
// several processes each server's process serves it on its own RPC port with
// remote.ServeServer, and the coordinator reaches it through a remote.Server. Either way the
// coordinator makes the calls:
//
//	srv, err := ps.NewServer(ps.ServerConfig{ID: "ps-0", Secret: secret, Slots: 1024, Tables: specs})
//	s, err := server.New(srv, addr, checkpoint.Config{Job: "ctr", Storage: store, ShmDir: "/dev/shm/ctr"})
//	err = remote.ServeServer(srv, s) // in a server's own process
//	go srv.Serve(listener)
//
// # Incarnations and leaders
//
// Every Server has an incarnation, random and new each time one is made (each process start),
// which Health reports: the coordinator tells a restarted server from the one it admitted by
// it. A Server obeys the newest coordinator incarnation that has led it (Lead); Obeys refuses
// the calls of an earlier one with elastic.ErrSuperseded, and remote.ServeServer checks it for
// every call but Health, Table and Lead. A Server made without checkpoint storage serves and
// takes owner tables, but its checkpoint calls fail with ErrNoCheckpoints.
//
// # Concurrency and ownership
//
// A Server is safe for concurrent use. An owner table it is given becomes the ps.Server's
// (ps.OwnerTable is immutable once made), and Table returns that one: neither side changes it.
// The Progress values a Snapshot is given are read during the call only; what Restored returns
// is not changed afterwards. Close closes the checkpointer, not the ps.Server, which its owner
// closes; it is idempotent.
package server
