package elastic

import "fmt"

// Role is what a member of the job does.
type Role uint8

// The roles; the zero Role is none (invalid in a Member).
const (
	RoleServer      Role = iota + 1 // a parameter server
	RoleWorker                      // a worker
	RoleCoordinator                 // the job's coordinator
)

// String returns "ps", "worker" or "coordinator".
func (r Role) String() string {
	switch r {
	case RoleServer:
		return "ps"
	case RoleWorker:
		return "worker"
	case RoleCoordinator:
		return "coordinator"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// Member is one process of the job as gossip knows it.
type Member struct {
	// Role is what the process does.
	Role Role
	// ID is the node id, such as "ps-0" or "worker-3"; a restarted process keeps it.
	ID string
	// Incarnation is new each time the process starts; never 0.
	Incarnation uint64
	// Addr is the process's RPC address, host:port.
	Addr string
	// Host identifies the machine: processes with the same Host share shared memory.
	Host string
	// Gossip is the member's gossip address, host:port. It is not gossiped in the meta but
	// filled from memberlist.
	Gossip string
}

// MemberEventKind is what happened to a member.
type MemberEventKind uint8

// The kinds of MemberEvent.
const (
	// MemberJoined: the member is alive (it joined, or this process learnt of it).
	MemberJoined MemberEventKind = iota + 1
	// MemberLeft: the member left gracefully (membership.Gossip.Leave or Close).
	MemberLeft
	// MemberFailed: gossip declared the member dead (it stopped answering probes). A leave
	// whose announcement was missed is also reported as a failure, never the reverse.
	MemberFailed
	// MemberUpdated: the member's meta changed.
	MemberUpdated
)

// String returns "joined", "left", "failed" or "updated".
func (k MemberEventKind) String() string {
	switch k {
	case MemberJoined:
		return "joined"
	case MemberLeft:
		return "left"
	case MemberFailed:
		return "failed"
	case MemberUpdated:
		return "updated"
	}
	return fmt.Sprintf("MemberEventKind(%d)", uint8(k))
}

// MemberEvent is a change in the membership: Kind happened to Member, which may be the local
// process (its own MemberJoined comes first, its MemberLeft when it leaves).
type MemberEvent struct {
	Kind   MemberEventKind
	Member Member
}
