// Package memnet is an in-memory network for tests: named hosts listen and
// dial through a transport.Transport (Host), and the Network injects faults
// between them.
//
// Connections are reliable ordered byte streams with net.Conn semantics:
// deadlines, Close unblocking blocked calls, a bounded per-direction buffer
// (Config.Window) that makes writers wait for slow readers. Write copies the
// caller's bytes before returning; Read fills only the caller's slice.
//
// # Faults
//
// Faults apply to links between hosts (by name), to existing connections and
// to new ones alike:
//
//   - Partition(a, b) / Heal(a, b): both directions are cut. Dials fail with
//     ErrUnreachable; bytes on existing connections are held (not lost) and
//     delivered on Heal, so calls time out meanwhile and late answers arrive
//     after.
//   - SetDrop(from, to, true/false): bytes from -> to silently vanish; the
//     writer sees success. A connection that lost bytes never delivers in
//     that direction again and is reset when the drop is lifted.
//   - SetDelay(from, to, d): bytes from -> to become readable d after they
//     were written (latency, in order).
//   - Kill(host) / Restart(host): the host crashes: listeners close,
//     connections are reset (peers see ErrReset, the host's own ends
//     net.ErrClosed) and it cannot dial, listen or be dialed until restarted,
//     after which its programs must listen again.
//   - HealAll: remove every partition, drop and delay.
//
// Links from a host to itself are never cut. Delays use the real clock; the
// other faults take effect immediately and deterministically.
//
// # Concurrency
//
// Every method of Network, Host, the listeners and the connections is safe
// for concurrent use. The package starts no goroutines.
package memnet
