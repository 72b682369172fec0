package memnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elasticps/elasticps/internal/transport"
)

// DefaultWindow is the per-direction buffer of a connection when
// Config.Window is not positive: 4 MiB.
const DefaultWindow = 4 << 20

var (
	// ErrRefused is returned by Dial when nothing listens on the address.
	ErrRefused = errors.New("memnet: connection refused")
	// ErrUnreachable is returned by Dial when the two hosts are partitioned.
	ErrUnreachable = errors.New("memnet: host unreachable")
	// ErrHostDown is returned by Dial and Listen on a killed host.
	ErrHostDown = errors.New("memnet: host is down")
	// ErrAddrInUse is returned by Listen when the address is taken.
	ErrAddrInUse = errors.New("memnet: address already in use")
	// ErrReset is returned by reads and writes on a connection whose peer
	// host was killed, that lost bytes to a drop that has been lifted, or
	// that was never accepted before its listener closed.
	ErrReset = errors.New("memnet: connection reset by peer")
	// ErrBrokenPipe is returned by writes after the peer closed its end.
	ErrBrokenPipe = errors.New("memnet: broken pipe")
)

// Config configures a Network.
type Config struct {
	// Window is how many unread bytes one direction of a connection holds
	// before Write blocks, like a socket buffer. Non-positive means
	// DefaultWindow. Smaller windows exercise back-pressure; larger ones let
	// writers run further ahead of a partitioned or slow reader.
	Window int
}

// link names a direction between two hosts.
type link struct{ from, to string }

// Network is an in-memory network of named hosts. Hosts listen and dial
// through the Transport returned by Host; the Network injects faults between
// them. All methods are safe for concurrent use. A Network starts no
// goroutines and needs no closing.
type Network struct {
	window int

	mu        sync.Mutex
	hosts     map[string]*Host
	listeners map[Addr]*listener
	pairs     map[*pair]struct{}
	cuts      map[link]bool // both orders are stored
	drops     map[link]bool
	delays    map[link]time.Duration
	port      int
}

// New returns an empty network.
func New(cfg Config) *Network {
	w := cfg.Window
	if w <= 0 {
		w = DefaultWindow
	}
	return &Network{
		window:    w,
		hosts:     make(map[string]*Host),
		listeners: make(map[Addr]*listener),
		pairs:     make(map[*pair]struct{}),
		cuts:      make(map[link]bool),
		drops:     make(map[link]bool),
		delays:    make(map[link]time.Duration),
		port:      49152,
	}
}

// Host returns the host with the given name, creating it (up) on first use.
// Its Transport listens and dials as that host.
func (n *Network) Host(name string) *Host {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.hostLocked(name)
}

func (n *Network) hostLocked(name string) *Host {
	h := n.hosts[name]
	if h == nil {
		h = &Host{n: n, name: name}
		n.hosts[name] = h
	}
	return h
}

// Partition cuts the link between hosts a and b in both directions: dials
// between them fail with ErrUnreachable, and existing connections between
// them deliver nothing (bytes stay in flight, as TCP would retransmit them)
// until Heal, so calls over them time out. Writers block once the window is
// full.
func (n *Network) Partition(a, b string) { n.setCut(a, b, true) }

// Heal undoes Partition(a, b): held bytes are delivered and dials succeed.
func (n *Network) Heal(a, b string) { n.setCut(a, b, false) }

func (n *Network) setCut(a, b string, cut bool) {
	if a == b {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if cut {
		n.cuts[link{a, b}], n.cuts[link{b, a}] = true, true
	} else {
		delete(n.cuts, link{a, b})
		delete(n.cuts, link{b, a})
	}
	n.eachPipeLocked(func(l link, p *pipe, _ *pair) {
		if (l.from == a && l.to == b) || (l.from == b && l.to == a) {
			p.update(func(p *pipe) { p.held = cut })
		}
	})
}

// SetDrop makes the link from -> to lose every byte written while drop is
// true. Writers are told their writes succeeded. A reliable stream cannot
// skip bytes, so a connection that lost any stays silent in that direction
// (calls over it time out) and is reset (ErrReset on both ends) when the drop
// is lifted, as TCP eventually resets a connection whose data is never
// acknowledged. Connections that lost nothing are unaffected. Dials still
// succeed, but a handshake over a dropping link never completes.
func (n *Network) SetDrop(from, to string, drop bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := link{from, to}
	if drop {
		n.drops[l] = true
	} else {
		delete(n.drops, l)
	}
	n.eachPipeLocked(func(pl link, p *pipe, pr *pair) {
		if pl != l {
			return
		}
		var broken bool
		p.update(func(p *pipe) {
			p.dropping = drop
			broken = p.broken
		})
		if !drop && broken {
			n.resetPairLocked(pr)
		}
	})
}

// SetDelay adds latency d to every byte written from -> to from now on;
// zero removes it. Bytes stay in order; the delay is latency, not bandwidth.
func (n *Network) SetDelay(from, to string, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	l := link{from, to}
	if d > 0 {
		n.delays[l] = d
	} else {
		delete(n.delays, l)
	}
	n.eachPipeLocked(func(pl link, p *pipe, _ *pair) {
		if pl == l {
			p.update(func(p *pipe) { p.delay = max(d, 0) })
		}
	})
}

// HealAll removes every partition, drop and delay, as if each had been
// undone one by one.
func (n *Network) HealAll() {
	n.mu.Lock()
	var drops []link
	for l := range n.drops {
		drops = append(drops, l)
	}
	clear(n.cuts)
	clear(n.delays)
	n.eachPipeLocked(func(_ link, p *pipe, _ *pair) {
		p.update(func(p *pipe) { p.held, p.delay = false, 0 })
	})
	n.mu.Unlock()
	for _, l := range drops {
		n.SetDrop(l.from, l.to, false)
	}
}

// Kill crashes host name: its listeners close, its connections close (its own
// ends fail with net.ErrClosed, their peers with ErrReset, unread data is
// lost) and it can neither listen nor dial nor be dialed until Restart.
func (n *Network) Kill(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.hostLocked(name)
	h.down = true
	for a, l := range n.listeners {
		if l.host == h {
			delete(n.listeners, a)
			l.shut()
		}
	}
	for p := range n.pairs {
		if p.hosts[0] != name && p.hosts[1] != name {
			continue
		}
		delete(n.pairs, p)
		// Reset first: a peer woken by the closes below must see the reset, not an end of file.
		p.pipes[0].resetWith(ErrReset)
		p.pipes[1].resetWith(ErrReset)
		for side := range 2 {
			if p.hosts[side] == name && !p.closed[side] {
				p.closed[side] = true
				p.ends[side].in.closeReader()
				p.ends[side].out.closeWriter()
			}
		}
	}
}

// Restart brings a killed host back up. Nothing of its old state returns:
// whatever ran there must listen again.
func (n *Network) Restart(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hostLocked(name).down = false
}

// eachPipeLocked calls f for both pipes of every live connection.
func (n *Network) eachPipeLocked(f func(l link, p *pipe, pr *pair)) {
	for pr := range n.pairs {
		f(link{pr.hosts[0], pr.hosts[1]}, pr.pipes[0], pr)
		f(link{pr.hosts[1], pr.hosts[0]}, pr.pipes[1], pr)
	}
}

func (n *Network) resetPairLocked(pr *pair) {
	delete(n.pairs, pr)
	pr.pipes[0].resetWith(ErrReset)
	pr.pipes[1].resetWith(ErrReset)
}

// markClosed records that one end of p was closed and reports whether it was
// open; the pair is forgotten once both ends are closed.
func (n *Network) markClosed(p *pair, side int) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p.closed[side] {
		return false
	}
	p.closed[side] = true
	if p.closed[0] && p.closed[1] {
		delete(n.pairs, p)
	}
	return true
}

func (n *Network) nextAddrLocked(host string) Addr {
	n.port++
	return Addr(host + ":" + strconv.Itoa(n.port))
}

// newPairLocked creates a connection from host a (address la) to the
// listener l, with the faults currently configured.
func (n *Network) newPairLocked(a string, la Addr, l *listener) *pair {
	b := l.host.name
	pr := &pair{hosts: [2]string{a, b}}
	for i, lk := range [2]link{{a, b}, {b, a}} {
		p := newPipe(n.window)
		p.held = n.cuts[lk]
		p.dropping = n.drops[lk]
		p.delay = n.delays[lk]
		pr.pipes[i] = p
	}
	pr.ends[0] = &conn{n: n, p: pr, side: 0, in: pr.pipes[1], out: pr.pipes[0], local: la, remote: l.addr}
	pr.ends[1] = &conn{n: n, p: pr, side: 1, in: pr.pipes[0], out: pr.pipes[1], local: l.addr, remote: la}
	n.pairs[pr] = struct{}{}
	return pr
}

// Host is one machine on a Network. It implements transport.Transport.
type Host struct {
	n    *Network
	name string
	down bool // guarded by n.mu
}

var _ transport.Transport = (*Host)(nil)

// Name returns the host's name.
func (h *Host) Name() string { return h.name }

// Listen listens on addr. The address is any unique string; by convention
// "host:port". An empty address or one ending in ":0" gets a fresh port on
// this host ("name:N"). Addresses belong to the network, not to the host: a
// dial to addr reaches this host whatever addr says.
func (h *Host) Listen(addr string) (net.Listener, error) {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if h.down {
		return nil, fmt.Errorf("listen %s on %s: %w", addr, h.name, ErrHostDown)
	}
	a := Addr(addr)
	if addr == "" || strings.HasSuffix(addr, ":0") {
		a = n.nextAddrLocked(h.name)
	}
	if n.listeners[a] != nil {
		return nil, fmt.Errorf("listen %s: %w", a, ErrAddrInUse)
	}
	l := &listener{n: n, host: h, addr: a, wake: make(chan struct{})}
	n.listeners[a] = l
	return l, nil
}

// Dial connects to the listener at addr. It fails at once with ErrHostDown if
// this host is down, ErrRefused if nothing listens there and ErrUnreachable
// if the hosts are partitioned; otherwise the connection is established
// immediately (faults then apply to its bytes).
func (h *Host) Dial(ctx context.Context, addr string) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if h.down {
		return nil, fmt.Errorf("dial %s from %s: %w", addr, h.name, ErrHostDown)
	}
	l := n.listeners[Addr(addr)]
	if l == nil {
		return nil, fmt.Errorf("dial %s: %w", addr, ErrRefused)
	}
	if n.cuts[link{h.name, l.host.name}] {
		return nil, fmt.Errorf("dial %s from %s: %w", addr, h.name, ErrUnreachable)
	}
	pr := n.newPairLocked(h.name, n.nextAddrLocked(h.name), l)
	if !l.enqueue(pr.ends[1]) {
		n.resetPairLocked(pr)
		return nil, fmt.Errorf("dial %s: %w", addr, ErrRefused)
	}
	return pr.ends[0], nil
}
