package rpc

import (
	"log/slog"
	"net"
	"sync"
	"time"
)

// gate counts a server's connections that are not yet authenticated, in
// total and per source host, and refuses those beyond the limits.
type gate struct {
	max, perHost int

	mu     sync.Mutex
	total  int
	byHost map[string]int
}

func newGate(max, perHost int) *gate {
	return &gate{max: max, perHost: perHost, byHost: make(map[string]int)}
}

// enter admits a connection from host, or reports that a limit is reached
// (perHost says which).
func (g *gate) enter(host string) (ok, perHost bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.total >= g.max {
		return false, false
	}
	if g.byHost[host] >= g.perHost {
		return false, true
	}
	g.total++
	g.byHost[host]++
	return true, false
}

// leave ends the handshake of a connection that enter admitted.
func (g *gate) leave(host string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.total--
	if n := g.byHost[host] - 1; n > 0 {
		g.byHost[host] = n
	} else {
		delete(g.byHost, host)
	}
}

// SourceHost is the host part of a connection's remote address: the IP
// address on TCP. Addresses without a port are used whole. The limits on
// unauthenticated connections per source count by it.
func SourceHost(a net.Addr) string {
	if a == nil {
		return ""
	}
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	s := a.String()
	if host, _, err := net.SplitHostPort(s); err == nil {
		return host
	}
	return s
}

// inflight counts the bytes one connection holds in the server (see
// ServerConfig.MaxConnInFlight). The reading goroutine waits for it to
// drop below the limit before it reads the next request; handlers and the
// frame writer add and remove bytes.
type inflight struct {
	limit int

	mu    sync.Mutex
	n     int
	below chan struct{} // closed when n drops below limit; nil if nobody waits
}

func (f *inflight) add(n int) {
	f.mu.Lock()
	f.n += n
	f.mu.Unlock()
}

func (f *inflight) sub(n int) {
	if n == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n -= n
	if f.n < f.limit && f.below != nil {
		close(f.below)
		f.below = nil
	}
}

// full returns nil if the connection is below its limit, else a channel
// closed once it is.
func (f *inflight) full() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n < f.limit {
		return nil
	}
	if f.below == nil {
		f.below = make(chan struct{})
	}
	return f.below
}

// Log rate limit for lines a peer can cause: a burst, then one a second.
const (
	peerLogBurst    = 10
	peerLogInterval = time.Second
)

// rateLog passes warnings to a logger at a limited rate: a burst of lines,
// then one per interval; the next line that passes after some were dropped
// says how many (attribute "suppressed"). A flood of bad connections thus
// writes a bounded number of lines. Safe for concurrent use.
type rateLog struct {
	log      *slog.Logger
	burst    int
	interval time.Duration
	now      func() time.Time

	mu      sync.Mutex
	tokens  int
	last    time.Time // when tokens were last refilled
	dropped int
}

func newRateLog(log *slog.Logger, burst int, interval time.Duration, now func() time.Time) *rateLog {
	return &rateLog{log: log, burst: burst, interval: interval, now: now, tokens: burst, last: now()}
}

// Warn logs msg with args unless the rate is exceeded.
func (r *rateLog) Warn(msg string, args ...any) {
	r.mu.Lock()
	now := r.now()
	if refill := int(now.Sub(r.last) / r.interval); refill > 0 {
		r.tokens = min(r.burst, r.tokens+refill)
		r.last = r.last.Add(time.Duration(refill) * r.interval)
	}
	if r.tokens == 0 {
		r.dropped++
		r.mu.Unlock()
		return
	}
	r.tokens--
	dropped := r.dropped
	r.dropped = 0
	r.mu.Unlock()
	if dropped > 0 {
		args = append(args, "suppressed", dropped)
	}
	r.log.Warn(msg, args...)
}
