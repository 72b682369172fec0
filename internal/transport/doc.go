// Package transport is the seam between elasticps and the network: a
// Transport listens and dials stream connections (net.Listener, net.Conn)
// and everything above it, package rpc in particular, is written against
// that interface only.
//
// TCP is the production implementation. Package memnet, below this one, is
// an in-memory network with fault injection (drop, delay, partition, kill)
// for tests of every package that talks over the network.
//
// # Contract
//
// Listen and Dial are safe for concurrent use. Dial honours its context
// while the connection is being set up and not after. Connections follow the
// net.Conn contract: Read and Write may be called concurrently with each
// other, deadlines make blocked calls return an error for which
// errors.Is(err, os.ErrDeadlineExceeded) holds, and Close unblocks them.
// Write does not keep the caller's slice after it returns, and Read fills
// only the caller's slice: a transport never owns caller memory.
package transport
