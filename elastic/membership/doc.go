// Package membership tells the processes of an elastic job which of them are alive: a Gossip
// is one process's membership of the job's gossip, run with hashicorp/memberlist (SWIM:
// probes, indirect probes, suspicion, push-pull anti-entropy). Parameter servers, workers and
// the coordinator each run one and gossip their elastic.Member (role, node id, incarnation, RPC
// address, host id) as node meta. The coordinator's process hands its events to
// elastic.Coordinator.Observe, to hear early that a process is gone or restarted, and looks
// nodes up (Lookup); a process that shares a host with a parameter server (Member.Host) may
// reattach its shared memory.
//
//	g, err := membership.New(ctx, membership.Config{
//		Self:    elastic.Member{Role: elastic.RoleCoordinator, ID: "coordinator", Incarnation: inc, Addr: rpcAddr},
//		Bind:    "0.0.0.0:7946",
//		Seeds:   seeds,
//		Secret:  secret,
//		OnEvent: coord.Observe,
//	})
//	defer g.Close()
//
// # Incarnations
//
// A member's memberlist node name is its node id and incarnation ("ps-0/1a2b"), so a
// restarted process is a new member, never a resurrection of the old one: it joins
// (elastic.MemberJoined, with the new incarnation) while the old incarnation is still being
// declared failed, and the two events may arrive in either order. A consumer compares
// incarnations; Lookup returns the newest alive.
//
// # A hint, not a verdict
//
// Gossip only makes the coordinator look sooner. A member under suspicion still counts as
// alive, and even an elastic.MemberFailed never evicts a parameter server by itself: the
// coordinator confirms by RPC (a server that answers its health check as the same incarnation
// is kept), and RPC errors, health checks and lease expiries are failure signals of their own,
// which work without any Gossip. A member that leaves (Leave, Close) is reported as
// elastic.MemberLeft; one whose leave was missed, as failed, never the reverse.
//
// # Security
//
// The gossip is encrypted and authenticated (AES-256-GCM) with a key derived from the cluster
// secret by HKDF-SHA256, and unencrypted or foreign-key messages are refused both ways: a
// process without the secret can neither join nor read the view. Nor can it exhaust the
// process's file descriptors through the gossip port: as on the RPC port, the TCP connections
// that have not delivered a sealed message yet are bounded in all and per source host
// (Config.MaxHandshakes, MaxHandshakesPerHost), and closed after Config.HandshakeTimeout
// (gate.go). The memberlist side (the meta encoding, the delegates, the event queue) is in
// transport.go.
//
// # Concurrency and ownership
//
// A Gossip is safe for concurrent use. Config.OnEvent is called from one goroutine, in order,
// and must not block for long (events queue behind it). Members returns a new slice each call,
// the caller's. Close leaves (unless Leave did), stops the gossip, delivers the events already
// queued and joins every goroutine; it is idempotent.
package membership
