package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/internal/transport"
	"github.com/elasticps/elasticps/internal/wire"
)

// Client calls servers by address. It keeps ConnsPerAddr persistent
// authenticated connections to each address it has called, dialed on
// demand and redialed after they die, and multiplexes concurrent calls over
// them. All methods are safe for concurrent use.
type Client struct {
	cfg         common
	tr          transport.Transport
	perAddr     int
	dialTimeout time.Duration
	tls         *tls.Config // nil: no TLS of our own
	pool        wire.Pool
	calls       sync.Pool // of *call

	ctx    context.Context // bounds dials; cancelled by Close
	cancel context.CancelFunc
	closed atomic.Bool
	peers  sync.Map // address -> *peer
	stats  counters

	mu    sync.Mutex
	conns map[*clientConn]struct{} // live connections, for Close
	wg    sync.WaitGroup           // dialers and connection readers
}

// peer is the set of connection slots for one address.
type peer struct {
	addr  string
	rr    atomic.Uint32
	slots []slot
}

// slot holds at most one connection, and the dial replacing it.
type slot struct {
	mu      sync.Mutex
	cc      *clientConn
	attempt *dialAttempt
}

// dialAttempt is one dial of a slot; cc and err are set before done closes.
type dialAttempt struct {
	done chan struct{}
	cc   *clientConn
	err  error
}

// NewClient returns a client; it connects lazily, on the first call to each
// address.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Client{
		cfg:         newCommon(cfg.Secret, cfg.Protection, cfg.Logger, cfg.MaxFrameSize, cfg.Compression, cfg.CompressThreshold, cfg.WriteTimeout),
		tr:          cfg.Transport,
		perAddr:     cfg.ConnsPerAddr,
		dialTimeout: cfg.DialTimeout,
		tls:         tls13(cfg.TLS),
		conns:       make(map[*clientConn]struct{}),
	}
	if c.tr == nil {
		c.tr = &transport.TCP{}
	}
	if c.perAddr == 0 {
		c.perAddr = DefaultConnsPerAddr
	}
	if c.dialTimeout == 0 {
		c.dialTimeout = DefaultDialTimeout
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// Call sends req to method at addr and waits for the answer.
//
// On success the returned slice is the response payload (nil if empty),
// owned by the caller; passing it to Release when done lets the client reuse
// its memory. req is only read, and not after Call returns.
//
// Errors: ctx.Err() if ctx ends first (a late response is discarded); a
// *RemoteError from the handler; otherwise an error naming addr that wraps
// ErrUnavailable (not processed, safe to retry), ErrConnClosed (the
// connection died after sending; outcome unknown), ErrAuth, ErrHandshake,
// ErrTooLarge or ErrClosed.
func (c *Client) Call(ctx context.Context, addr string, method uint16, req []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if len(req) > c.cfg.maxFrame {
		return nil, fmt.Errorf("rpc: call %s method %d: %w: request of %d bytes, limit %d", addr, method, ErrTooLarge, len(req), c.cfg.maxFrame)
	}
	p := c.peer(addr)
	// A connection found dead or draining when the call tries to use it
	// was never sent anything: try another, a bounded number of times.
	for attempt := 0; ; attempt++ {
		cc, err := c.conn(ctx, p)
		if err != nil {
			return nil, err
		}
		resp, err, retry := cc.call(ctx, method, req)
		if !retry || attempt >= c.perAddr || ctx.Err() != nil {
			if err != nil && ctx.Err() != nil && retry {
				return nil, ctx.Err()
			}
			return resp, err
		}
	}
}

// Stats returns the client's security counters.
func (c *Client) Stats() Stats { return c.stats.load() }

// Release hands a response returned by Call back to the client for reuse.
// It is optional; afterwards the caller must not touch b.
func (c *Client) Release(b []byte) { c.pool.Put(b) }

// Close closes every connection, failing calls in flight with an error
// wrapping ErrConnClosed and ErrClosed, and waits for the client's
// goroutines. Later calls return ErrClosed. It is idempotent and returns nil.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		c.wg.Wait()
		return nil
	}
	c.cancel()
	c.mu.Lock()
	conns := make([]*clientConn, 0, len(c.conns))
	for cc := range c.conns {
		conns = append(conns, cc)
	}
	c.mu.Unlock()
	for _, cc := range conns {
		cc.fail(ErrClosed)
	}
	c.wg.Wait()
	return nil
}

func (c *Client) peer(addr string) *peer {
	if p, ok := c.peers.Load(addr); ok {
		return p.(*peer)
	}
	p, _ := c.peers.LoadOrStore(addr, &peer{addr: addr, slots: make([]slot, c.perAddr)})
	return p.(*peer)
}

// conn returns a usable connection to p: the next slot's if it is alive,
// else any other live one while the slot redials, else the result of the
// slot's dial.
func (c *Client) conn(ctx context.Context, p *peer) (*clientConn, error) {
	// A dial this call only joined may have started before the server came (back) up; when it
	// fails, try once more with a dial of our own.
	for try := 0; ; try++ {
		cc, joined, err := c.connOnce(ctx, p)
		if err == nil || !joined || try > 0 || ctx.Err() != nil {
			return cc, err
		}
	}
}

// connOnce returns a usable connection of p, waiting for a dial when it has none; joined says
// whether the dial it waited for was already under way.
func (c *Client) connOnce(ctx context.Context, p *peer) (cc *clientConn, joined bool, err error) {
	n := uint32(len(p.slots))
	start := p.rr.Add(1)
	s := &p.slots[start%n]
	s.mu.Lock()
	if cc := s.cc; cc != nil && cc.usable() {
		s.mu.Unlock()
		return cc, false, nil
	}
	a := s.attempt
	joined = a != nil
	if a == nil {
		a = &dialAttempt{done: make(chan struct{})}
		if !c.startDial(p, s, a) {
			s.mu.Unlock()
			return nil, false, ErrClosed
		}
		s.attempt = a
	}
	s.mu.Unlock()
	for i := uint32(1); i < n; i++ {
		o := &p.slots[(start+i)%n]
		o.mu.Lock()
		cc := o.cc
		o.mu.Unlock()
		if cc != nil && cc.usable() {
			return cc, false, nil
		}
	}
	select {
	case <-a.done:
		if a.err != nil {
			return nil, joined, a.err
		}
		return a.cc, joined, nil
	case <-ctx.Done():
		return nil, joined, ctx.Err()
	}
}

func (c *Client) startDial(p *peer, s *slot, a *dialAttempt) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		cc, err := c.dial(p.addr)
		s.mu.Lock()
		s.attempt = nil
		if err == nil {
			s.cc = cc
		}
		s.mu.Unlock()
		a.cc, a.err = cc, err
		close(a.done)
	}()
	return true
}

// dial connects and authenticates one connection to addr and starts its
// reader.
func (c *Client) dial(addr string) (*clientConn, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.dialTimeout)
	defer cancel()
	nc, err := c.tr.Dial(ctx, addr)
	if err != nil {
		c.cfg.log.Debug("rpc: dial failed", "addr", addr, "err", err)
		return nil, fmt.Errorf("rpc: dial %s: %w: %w", addr, ErrUnavailable, err)
	}
	if c.tls != nil {
		nc = tls.Client(nc, clientTLS(c.tls, addr))
	}
	sess, err := clientHandshake(ctx, nc, &c.cfg)
	if err != nil {
		if errors.Is(err, ErrAuth) {
			c.stats.authFailures.Add(1)
		}
		_ = closeConn(nc)
		c.cfg.log.Warn("rpc: handshake failed", "addr", addr, "err", err)
		return nil, fmt.Errorf("rpc: connect %s: %w", addr, err)
	}
	cc := newClientConn(c, addr, nc, sess)
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		_ = closeConn(nc)
		return nil, ErrClosed
	}
	c.conns[cc] = struct{}{}
	c.wg.Add(1)
	c.mu.Unlock()
	go cc.readLoop()
	return cc, nil
}

func (c *Client) forget(cc *clientConn) {
	c.mu.Lock()
	delete(c.conns, cc)
	c.mu.Unlock()
}

// call is one outstanding request; its result arrives on ch (capacity 1).
type call struct {
	ch        chan result
	cc        *clientConn
	id        uint64      // set when queued
	abandoned atomic.Bool // the caller gave up; set only on calls never reused
}

type result struct {
	resp []byte
	err  error
}

func (c *Client) putCall(cl *call) {
	cl.cc, cl.id = nil, 0
	c.calls.Put(cl)
}

func (c *Client) getCall() *call {
	if cl, ok := c.calls.Get().(*call); ok {
		return cl
	}
	return &call{ch: make(chan result, 1)}
}
