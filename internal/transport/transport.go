package transport

import (
	"context"
	"net"
	"time"
)

// Transport opens stream connections. Implementations must be safe for
// concurrent use.
type Transport interface {
	// Listen announces addr and returns a listener for it. The listener's
	// Accept returns an error wrapping net.ErrClosed once it is closed.
	Listen(addr string) (net.Listener, error)
	// Dial connects to addr. It honours ctx for cancellation and deadline
	// during connection setup only; the returned connection outlives ctx.
	Dial(ctx context.Context, addr string) (net.Conn, error)
}

// TCP is the Transport over real TCP sockets. The zero value is ready to use.
type TCP struct {
	// KeepAlive is the TCP keep-alive period of dialed and accepted
	// connections. Zero means Go's default (15 s); negative disables
	// keep-alives. Keep-alives are what eventually breaks a connection to a
	// peer that vanished without closing it.
	KeepAlive time.Duration
}

var _ Transport = (*TCP)(nil)

// Listen listens on the TCP address addr ("host:port"; port 0 picks one).
func (t *TCP) Listen(addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: t.KeepAlive}
	return lc.Listen(context.Background(), "tcp", addr)
}

// Dial connects to the TCP address addr.
func (t *TCP) Dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{KeepAlive: t.KeepAlive}
	return d.DialContext(ctx, "tcp", addr)
}
