package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/elasticps/elasticps/internal/wire"
)

// clientConn is one authenticated connection of a Client. Its reader
// goroutine delivers responses to pending calls; callers write their own
// requests under the frame writer's lock.
type clientConn struct {
	c    *Client
	addr string
	nc   net.Conn
	sess session
	w    *frameWriter
	rd   *wire.Reader

	broken   atomic.Bool // failed: take no new calls
	draining atomic.Bool // the server sent goaway: take no new calls

	mu      sync.Mutex
	pending map[uint64]*call // nil once the connection failed
	err     error            // why it failed
}

func newClientConn(c *Client, addr string, nc net.Conn, sess session) *clientConn {
	cc := &clientConn{
		c:       c,
		addr:    addr,
		nc:      nc,
		sess:    sess,
		rd:      wire.NewReader(nc, wire.ReaderOptions{Pool: &c.pool, MaxFrameSize: c.cfg.maxFrame, Decompress: sess.compress, Protector: sess.recv}),
		pending: make(map[uint64]*call),
	}
	cc.w = newFrameWriter(nc, c.cfg.writeTimeout, sess.send, &c.pool, cc.fail)
	return cc
}

func (cc *clientConn) usable() bool { return !cc.broken.Load() && !cc.draining.Load() }

// fail records err as the reason the connection died, if it is the first,
// and closes it; the reader then fails every pending call.
func (cc *clientConn) fail(err error) {
	cc.mu.Lock()
	if cc.err == nil {
		cc.err = err
	}
	cc.mu.Unlock()
	cc.broken.Store(true)
	_ = closeConn(cc.nc)
}

func (cc *clientConn) notSent(err error) error {
	return fmt.Errorf("rpc: call %s: %w: %w", cc.addr, ErrUnavailable, err)
}

// call performs one call on this connection. retry reports that the request
// was certainly not processed and another connection may be tried.
func (cc *clientConn) call(ctx context.Context, method uint16, req []byte) (resp []byte, err error, retry bool) {
	if len(req) > cc.sess.peerMax {
		return nil, fmt.Errorf("rpc: call %s method %d: %w: request of %d bytes, server limit %d", cc.addr, method, ErrTooLarge, len(req), cc.sess.peerMax), false
	}
	c := cc.c
	h := wire.Header{Kind: wire.KindRequest, Method: method}
	payload := req
	if cc.sess.compress && len(req) >= c.cfg.compressThreshold {
		if comp, ok := wire.Compress(&c.pool, req); ok {
			defer c.pool.Put(comp)
			h.Flags, payload = wire.FlagCompressed, comp
		}
	}
	cl := c.getCall()
	cl.cc = cc
	if err := cc.w.send(ctx, h, payload, cl, 0); err != nil {
		// The frame was not (completely) written: the server cannot have
		// processed it.
		if cl.id != 0 && !cc.unregister(cl.id) {
			cl.abandoned.Store(true)
		} else {
			c.putCall(cl)
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr, false
		}
		return nil, cc.notSent(err), true
	}
	id := cl.id
	select {
	case r := <-cl.ch:
		c.putCall(cl)
		return r.resp, r.err, false
	case <-ctx.Done():
		if cc.unregister(id) {
			c.putCall(cl)
		} else {
			// The reader owns the call now and will deliver into cl.ch,
			// which nobody reads: never reuse cl.
			cl.abandoned.Store(true)
		}
		return nil, ctx.Err(), false
	}
}

// queued registers the call under id as its request is queued for writing
// (called by the frame writer with its lock held). A connection that failed
// or is draining takes no new calls.
func (cl *call) queued(id uint64) error {
	cc := cl.cc
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.pending == nil || cc.broken.Load() {
		if cc.err != nil {
			return cc.err
		}
		return errConnDead
	}
	if cc.draining.Load() {
		return errDraining
	}
	cl.id = id
	cc.pending[id] = cl
	return nil
}

var (
	errDraining = errors.New("server is shutting down")
	errConnDead = errors.New("connection is closed")
)

// unregister removes a pending call and reports whether it was still there.
func (cc *clientConn) unregister(id uint64) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if _, ok := cc.pending[id]; ok {
		delete(cc.pending, id)
		return true
	}
	return false
}

// take removes and returns the pending call with id, or nil.
func (cc *clientConn) take(id uint64) *call {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cl := cc.pending[id]
	if cl != nil {
		delete(cc.pending, id)
	}
	return cl
}

func (cc *clientConn) deliver(cl *call, r result) {
	if cl.abandoned.Load() {
		cc.c.pool.Put(r.resp)
		return
	}
	cl.ch <- r
}

func (cc *clientConn) readLoop() {
	c := cc.c
	defer c.wg.Done()
	err := cc.readFrames()
	cc.mu.Lock()
	if cc.err == nil {
		cc.err = err
	}
	cause := cc.err
	pending := cc.pending
	cc.pending = nil
	cc.mu.Unlock()
	cc.broken.Store(true)
	_ = closeConn(cc.nc)
	cc.w.stop()
	c.forget(cc)
	if errors.Is(cause, wire.ErrIntegrity) {
		c.stats.forgedFrames.Add(1) // counted before the calls fail, so their callers see it
	}
	for _, cl := range pending {
		cc.deliver(cl, result{err: fmt.Errorf("rpc: call %s: %w: %w", cc.addr, ErrConnClosed, cause)})
	}
	switch {
	case errors.Is(cause, ErrClosed):
	case errors.Is(cause, wire.ErrIntegrity):
		c.cfg.log.Warn("rpc: connection closed", "addr", cc.addr, "reason", cause.Error())
	case errors.Is(cause, wire.ErrTruncated), errors.Is(cause, wire.ErrTooLarge), errors.Is(cause, wire.ErrMalformed):
		c.cfg.log.Warn("rpc: connection closed", "addr", cc.addr, "reason", cause.Error())
	default:
		c.cfg.log.Debug("rpc: connection closed", "addr", cc.addr, "reason", cause.Error())
	}
}

// readFrames reads until the connection fails and returns why.
func (cc *clientConn) readFrames() error {
	c := cc.c
	for {
		f, err := cc.rd.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("server closed the connection: %w", err)
			}
			return fmt.Errorf("read: %w", err)
		}
		switch f.Kind {
		case wire.KindResponse:
			if cl := cc.take(f.ID); cl != nil {
				cc.deliver(cl, result{resp: f.Payload})
			} else {
				c.pool.Put(f.Payload) // a late answer to a cancelled call
			}
		case wire.KindError:
			code, msg, data, derr := wire.DecodeError(f.Payload)
			if derr != nil {
				c.pool.Put(f.Payload)
				return fmt.Errorf("error frame: %w", derr)
			}
			re := &RemoteError{Code: code, Message: msg}
			if len(data) > 0 {
				re.Data = append([]byte(nil), data...)
			}
			c.pool.Put(f.Payload)
			if cl := cc.take(f.ID); cl != nil {
				cc.deliver(cl, result{err: re})
			}
		case wire.KindGoAway:
			cc.goAway(f.ID)
		default:
			c.pool.Put(f.Payload)
			return fmt.Errorf("%w: unexpected %s frame from a server", wire.ErrMalformed, f.Kind)
		}
	}
}

// goAway stops new calls on the connection and fails the calls the server
// says it never read.
func (cc *clientConn) goAway(lastID uint64) {
	cc.draining.Store(true)
	var unread []*call
	cc.mu.Lock()
	for id, cl := range cc.pending {
		if id > lastID {
			unread = append(unread, cl)
			delete(cc.pending, id)
		}
	}
	cc.mu.Unlock()
	for _, cl := range unread {
		cc.deliver(cl, result{err: cc.notSent(errors.New("server is shutting down and did not read the request"))})
	}
}
