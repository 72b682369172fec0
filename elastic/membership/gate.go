package membership

// The gossip port's guard. memberlist serves every TCP connection of its port on a goroutine of
// its own until TCPTimeout (10 s by default), whether or not the peer knows the cluster key, and
// accepts as many as come: a flood of idle connections (no secret needed) takes the process to
// its file-descriptor limit, and its checkpoints then fail. The RPC port bounds its connections
// that have not authenticated (internal/rpc's gate); the gossip port does the same here, around
// whatever Transport memberlist uses.
//
// A gossip stream carries one exchange: the peer sends a message sealed with the cluster key
// (AES-GCM), memberlist opens it and answers. A stream is "in its handshake" from its accept
// until memberlist first writes to it (it has read and opened the peer's message, or it sends
// the error it closes the stream after) or it closes. Streams in their handshake are bounded in
// all (MaxHandshakes) and per source host (MaxHandshakesPerHost); one more is closed at accept.
// Each is closed HandshakeTimeout after its accept if still in its handshake, so an idle or slow
// peer holds a slot that long at most. Streams past their handshake are memberlist's, under its
// own TCPTimeout.

import (
	"log/slog"
	"maps"
	"net"
	"sync"
	"time"

	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/hashicorp/memberlist"
)

// Defaults of the gossip port's guard: those of the RPC port (internal/rpc).
const (
	defaultGossipHandshakeTimeout  = 5 * time.Second
	defaultGossipMaxHandshakes     = 128
	defaultGossipMaxHandshakesHost = 32
)

// gateWarnEvery bounds the rate of the warnings about streams refused.
const gateWarnEvery = time.Second

// streamGate is a memberlist transport that passes another's stream connections through the
// guard. Safe for concurrent use.
type streamGate struct {
	memberlist.NodeAwareTransport
	max, perHost int
	timeout      time.Duration
	log          *slog.Logger

	out       chan net.Conn
	done      chan struct{} // closed at Shutdown: no stream is handed on any more
	innerDown chan struct{} // closed once the inner transport has shut down
	wg        sync.WaitGroup
	shutOnce  sync.Once
	shutErr   error

	mu     sync.Mutex
	byHost map[string]int
	open   map[*gatedConn]struct{} // in their handshake
	stats  gateStats
	warned time.Time // the last warning about refused streams
	quiet  int       // streams refused since it
}

// gateStats counts what the guard did.
type gateStats struct {
	Refused  int            // streams closed at accept: a limit was reached
	Expired  int            // streams closed at HandshakeTimeout
	Most     int            // the most streams in their handshake at once
	MostHost map[string]int // the same, per source host
}

// nodeAware makes a memberlist.Transport a NodeAwareTransport, as memberlist does itself.
type nodeAware struct{ memberlist.Transport }

func (t nodeAware) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t nodeAware) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

func newStreamGate(inner memberlist.Transport, maxOpen, perHost int, timeout time.Duration, log *slog.Logger) *streamGate {
	na, ok := inner.(memberlist.NodeAwareTransport)
	if !ok {
		na = nodeAware{inner}
	}
	g := &streamGate{NodeAwareTransport: na, max: maxOpen, perHost: perHost, timeout: timeout, log: log,
		out: make(chan net.Conn), done: make(chan struct{}), innerDown: make(chan struct{}),
		byHost: map[string]int{}, open: map[*gatedConn]struct{}{}, stats: gateStats{MostHost: map[string]int{}}}
	g.wg.Add(1)
	go g.run()
	return g
}

// StreamCh implements memberlist.Transport: the streams the guard let in.
func (g *streamGate) StreamCh() <-chan net.Conn { return g.out }

// run takes the inner transport's streams until it has shut down (memberlist's NetTransport
// waits, at Shutdown, for a stream it accepted to be taken).
func (g *streamGate) run() {
	defer g.wg.Done()
	in := g.NodeAwareTransport.StreamCh()
	for {
		select {
		case c := <-in:
			gc := g.admit(c)
			if gc == nil {
				continue
			}
			select {
			case g.out <- gc:
			case <-g.done:
				gc.Close()
			}
		case <-g.innerDown:
			return
		}
	}
}

// admit lets c in, in its handshake, or closes it and returns nil.
func (g *streamGate) admit(c net.Conn) *gatedConn {
	host := rpc.SourceHost(c.RemoteAddr())
	g.mu.Lock()
	select {
	case <-g.done:
		g.mu.Unlock()
		c.Close()
		return nil
	default:
	}
	if len(g.open) >= g.max || g.byHost[host] >= g.perHost {
		limit := "MaxHandshakes"
		if len(g.open) < g.max {
			limit = "MaxHandshakesPerHost"
		}
		g.stats.Refused++
		g.quiet++
		warn, refused := false, g.quiet
		if now := time.Now(); now.Sub(g.warned) >= gateWarnEvery {
			warn, g.warned, g.quiet = true, now, 0
		}
		g.mu.Unlock()
		c.Close()
		if warn {
			g.log.Warn("refusing gossip connections: too many have not shown the cluster key yet", "from", host, "limit", limit, "refused", refused)
		}
		return nil
	}
	gc := &gatedConn{Conn: c, g: g, host: host, gated: true, limit: time.Now().Add(g.timeout)}
	g.open[gc] = struct{}{}
	g.byHost[host]++
	g.stats.Most = max(g.stats.Most, len(g.open))
	g.stats.MostHost[host] = max(g.stats.MostHost[host], g.byHost[host])
	gc.timer = time.AfterFunc(g.timeout, gc.expire)
	g.mu.Unlock()
	_ = c.SetDeadline(gc.limit) // memberlist sets its own, which gatedConn caps
	return gc
}

// leave ends c's handshake: it no longer counts.
func (g *streamGate) leave(c *gatedConn, expired bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.open[c]; !ok {
		return
	}
	delete(g.open, c)
	if n := g.byHost[c.host] - 1; n > 0 {
		g.byHost[c.host] = n
	} else {
		delete(g.byHost, c.host)
	}
	if expired {
		g.stats.Expired++
	}
}

// counts returns the guard's counters and the streams now in their handshake, by source host.
func (g *streamGate) counts() (gateStats, map[string]int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.stats
	st.MostHost = maps.Clone(g.stats.MostHost)
	return st, maps.Clone(g.byHost)
}

// Shutdown implements memberlist.Transport: it shuts the inner transport down, closes the
// streams still in their handshake and joins the guard's goroutine. Idempotent.
func (g *streamGate) Shutdown() error {
	g.shutOnce.Do(func() {
		g.mu.Lock()
		close(g.done)
		g.mu.Unlock()
		g.shutErr = g.NodeAwareTransport.Shutdown()
		close(g.innerDown)
		g.wg.Wait()
		g.mu.Lock()
		open := make([]*gatedConn, 0, len(g.open))
		for c := range g.open {
			open = append(open, c)
		}
		g.mu.Unlock()
		for _, c := range open {
			c.Close()
		}
	})
	return g.shutErr
}

// gatedConn is a stream the guard let in. While it is in its handshake its deadlines are
// capped at its accept plus HandshakeTimeout; memberlist's first write ends the handshake and
// applies the deadline memberlist asked for.
type gatedConn struct {
	net.Conn
	g     *streamGate
	host  string
	limit time.Time // the end of its handshake at the latest
	timer *time.Timer

	mu       sync.Mutex
	gated    bool
	deadline time.Time // the one memberlist asked for
}

func (c *gatedConn) Write(b []byte) (int, error) {
	c.pass()
	return c.Conn.Write(b)
}

// pass ends the handshake.
func (c *gatedConn) pass() {
	c.mu.Lock()
	if !c.gated {
		c.mu.Unlock()
		return
	}
	c.gated = false
	c.timer.Stop()
	d := c.deadline
	c.mu.Unlock()
	c.g.leave(c, false)
	_ = c.Conn.SetDeadline(d)
}

// expire closes a stream still in its handshake.
func (c *gatedConn) expire() {
	c.mu.Lock()
	gated := c.gated
	c.gated = false
	c.mu.Unlock()
	if gated {
		c.g.leave(c, true)
		c.Conn.Close()
	}
}

func (c *gatedConn) Close() error {
	c.mu.Lock()
	gated := c.gated
	c.gated = false
	c.timer.Stop()
	c.mu.Unlock()
	if gated {
		// Closed by memberlist when its read hit the handshake's deadline: expired too.
		c.g.leave(c, !time.Now().Before(c.limit))
	}
	return c.Conn.Close()
}

// capped returns t, capped at the handshake's end while in it; it records t as asked.
func (c *gatedConn) capped(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.gated {
		return t
	}
	c.deadline = t
	if t.IsZero() || t.After(c.limit) {
		return c.limit
	}
	return t
}

func (c *gatedConn) SetDeadline(t time.Time) error      { return c.Conn.SetDeadline(c.capped(t)) }
func (c *gatedConn) SetReadDeadline(t time.Time) error  { return c.Conn.SetReadDeadline(c.capped(t)) }
func (c *gatedConn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.capped(t)) }
