package memnet

import (
	"net"
	"time"
)

// Addr is the address of a memnet listener or connection end.
type Addr string

// Network returns "memnet".
func (a Addr) Network() string { return "memnet" }

// String returns the address.
func (a Addr) String() string { return string(a) }

// pair is one connection: two ends and a pipe in each direction.
type pair struct {
	hosts  [2]string // hosts[0] dialed hosts[1]
	ends   [2]*conn
	pipes  [2]*pipe // pipes[i] carries bytes written by ends[i]
	closed [2]bool  // guarded by Network.mu
}

// conn is one end of a pair. It implements net.Conn.
type conn struct {
	n      *Network
	p      *pair
	side   int
	in     *pipe // read from
	out    *pipe // written to
	local  Addr
	remote Addr
}

var _ net.Conn = (*conn)(nil)

func (c *conn) Read(b []byte) (int, error)  { return c.in.read(b) }
func (c *conn) Write(b []byte) (int, error) { return c.out.write(b) }

// Close closes this end: its own blocked and later calls fail with
// net.ErrClosed, the peer reads what was already sent and then io.EOF, and
// the peer's writes fail with ErrBrokenPipe.
func (c *conn) Close() error {
	if !c.n.markClosed(c.p, c.side) {
		return net.ErrClosed
	}
	c.in.closeReader()
	c.out.closeWriter()
	return nil
}

func (c *conn) LocalAddr() net.Addr  { return c.local }
func (c *conn) RemoteAddr() net.Addr { return c.remote }

func (c *conn) SetDeadline(t time.Time) error {
	_ = c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

func (c *conn) SetReadDeadline(t time.Time) error {
	c.in.update(func(p *pipe) { p.rdl = t })
	return nil
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	c.out.update(func(p *pipe) { p.wdl = t })
	return nil
}
