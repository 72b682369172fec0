package shardnet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardwire"
)

// Client is a shard.Service that calls a dispatcher served by a Server. Give it to a
// shard.Reader as ReaderConfig.Service. It connects lazily, keeps ClientConfig.Conns
// authenticated connections and redials after they fail. All methods are safe for concurrent
// use.
//
// Errors: the dispatcher's own errors arrive as the same sentinels as in process
// (shard.ErrStaleLease, a *shard.WaitError, ...; shardwire.ErrRemote for a failure without
// one); a call that got no answer returns ErrUnavailable, which a Reader retries; ErrAuth,
// ErrProtocol and ErrClosed match shard.ErrPermanent, which it does not retry; a call whose
// context ended returns the context's error.
//
// An Acquire whose answer is late (the call timed out, or its context ended) is not forgotten:
// the request stays outstanding (up to ten CallTimeouts), and the next Acquire for the same
// worker and address waits for it and returns its lease. Without this, every Acquire retried
// during a partition would be granted a shard once the partition heals, and the dispatcher
// would revoke the worker's older leases to stay within its lease limit, counting failures.
//
// The Client implements shard.ReportAcquirer: ReportAndAcquire is one round trip. It needs no
// such bookkeeping, because the dispatcher itself answers a repeated combined call with the
// lease the first one granted (see shard.ReportAcquirer), so a call that timed out is simply
// retried. It does not collect a late Acquire answer either: after giving up on an Acquire, a
// caller should get its next lease from Acquire (shard.Reader does). Against a server that does
// not know the call, or whose service cannot make it, ReportAndAcquire returns an error
// matching errors.ErrUnsupported, and the caller makes the two calls instead.
type Client struct {
	cfg  ClientConfig
	rpc  *rpc.Client
	addr atomic.Pointer[string]
	bufs sync.Pool // *[]byte request scratch

	ctx    context.Context // bounds outstanding acquires; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // outstanding acquires

	mu       sync.Mutex
	closed   bool
	acquires map[string]*acquireCall // by worker: outstanding or answered and not yet taken
}

var (
	_ shard.Service        = (*Client)(nil)
	_ shard.ReportAcquirer = (*Client)(nil)
)

// acquireCall is one Acquire request on the wire. Its result fields are written before done
// is closed.
type acquireCall struct {
	done  chan struct{}
	addr  string
	lease shard.Lease
	err   error
	at    time.Time // when the answer (or failure) came
	taken bool      // guarded by Client.mu: a caller has returned the result
}

// NewClient returns a client for the dispatcher at cfg.Addr, or an error joining every problem
// of cfg. It connects on the first call.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	rc := rpc.ClientConfig{
		Secret: cfg.Secret, Logger: cfg.Logger, ConnsPerAddr: cfg.Conns,
		DialTimeout: cfg.DialTimeout, MaxFrameSize: maxFrame,
	}
	if cfg.Transport != nil {
		rc.Transport = cfg.Transport
	}
	r, err := rpc.NewClient(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c := &Client{cfg: cfg, rpc: r, acquires: make(map[string]*acquireCall)}
	c.addr.Store(&cfg.Addr)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// Addr returns the dispatcher address calls go to.
func (c *Client) Addr() string { return *c.addr.Load() }

// SetAddr sends later calls to addr: the coordinator moved (a restarted coordinator serving
// from another process). Calls in flight finish at the old address; leases granted there are
// fenced by the new dispatcher's incarnation.
func (c *Client) SetAddr(addr string) { c.addr.Store(&addr) }

// Close fails the calls in flight with ErrClosed, closes the connections and waits for the
// client's goroutines. Later calls return ErrClosed. It is idempotent and returns nil.
func (c *Client) Close() error {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	c.mu.Unlock()
	if !already {
		c.cancel()
		_ = c.rpc.Close()
	}
	c.wg.Wait()
	return nil
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Client) closedErr(op string) error {
	return &permanent{fmt.Errorf("%w: %s", ErrClosed, op)}
}

func checkWorker(worker string) error {
	if worker == "" || len(worker) > shard.MaxWorkerName {
		return fmt.Errorf("%w: %d bytes", shard.ErrBadWorker, len(worker))
	}
	return nil
}

// Acquire leases the next shard to worker (see shard.Service). It waits at most CallTimeout for
// the answer; a late answer is returned by the worker's next Acquire.
func (c *Client) Acquire(ctx context.Context, worker string) (shard.Lease, error) {
	if err := ctx.Err(); err != nil {
		return shard.Lease{}, err
	}
	if err := checkWorker(worker); err != nil {
		return shard.Lease{}, err
	}
	start := time.Now()
	timer := time.NewTimer(c.cfg.CallTimeout)
	defer timer.Stop()
	for {
		call, err := c.acquireCall(worker)
		if err != nil {
			return shard.Lease{}, err
		}
		select {
		case <-call.done:
		case <-ctx.Done():
			return shard.Lease{}, ctx.Err()
		case <-timer.C:
			return shard.Lease{}, fmt.Errorf("%w: acquire at %s: no answer within %v", ErrUnavailable, call.addr, c.cfg.CallTimeout)
		}
		if c.take(worker, call, start) {
			return call.lease, call.err
		}
	}
}

// acquireCall returns worker's outstanding (or answered, untaken) acquire request, or sends
// one.
func (c *Client) acquireCall(worker string) (*acquireCall, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, c.closedErr("acquire")
	}
	addr := c.Addr()
	if call := c.acquires[worker]; call != nil && call.addr == addr {
		return call, nil
	}
	// A request to an address given up by SetAddr is left to finish on its own.
	call := &acquireCall{done: make(chan struct{}), addr: addr}
	c.acquires[worker] = call
	c.wg.Add(1)
	go c.runAcquire(call, worker)
	return call, nil
}

// take claims the result of an answered call for a caller that started waiting at start (the
// caller then returns call.lease and call.err). It reports false when the caller must send a new request instead: another caller took the
// result, the result is an error from before this caller asked (a failure it did not wait
// for), or a lease answered so long ago that half its TTL is gone (it is left to expire).
func (c *Client) take(worker string, call *acquireCall, start time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.acquires[worker] == call {
		delete(c.acquires, worker)
	}
	if call.taken {
		return false
	}
	call.taken = true
	if call.err != nil && call.at.Before(start) {
		return false
	}
	return call.err != nil || call.lease.TTL <= 0 || time.Since(call.at) < call.lease.TTL/2
}

// outstandingCalls is how many CallTimeouts an acquire request waits for its answer in the
// background before it is abandoned.
const outstandingCalls = 10

// runAcquire sends one acquire request and stores its result. It runs until the answer comes,
// the connection fails, the client closes, or outstandingCalls CallTimeouts have passed.
func (c *Client) runAcquire(call *acquireCall, worker string) {
	defer c.wg.Done()
	defer close(call.done)
	bp := c.scratch()
	*bp = shardwire.AppendAcquireRequest(*bp, shardwire.AcquireRequest{Worker: worker})
	ctx, cancel := context.WithTimeout(c.ctx, outstandingCalls*c.cfg.CallTimeout)
	resp, err := c.rpc.Call(ctx, call.addr, methodAcquire, *bp)
	expired := ctx.Err() != nil
	cancel()
	c.bufs.Put(bp)
	call.at = time.Now()
	if err != nil {
		if expired && !c.isClosed() {
			err = fmt.Errorf("no answer within %v", outstandingCalls*c.cfg.CallTimeout)
		}
		call.err = c.callError("acquire", call.addr, err)
		return
	}
	r, rest, err := shardwire.DecodeAcquireResponse(resp)
	c.rpc.Release(resp)
	switch {
	case err != nil:
		call.err = protocolError("acquire", call.addr, err)
	case len(rest) != 0:
		call.err = protocolError("acquire", call.addr, fmt.Errorf("%d trailing bytes", len(rest)))
	case r.Code == shardwire.Canceled:
		call.err = fmt.Errorf("%w: acquire at %s: the dispatcher cancelled the call", ErrUnavailable, call.addr)
	default:
		call.lease, call.err = r.Result()
	}
}

// Report sends worker's progress on a lease (see shard.Service).
func (c *Client) Report(ctx context.Context, worker string, lease shard.LeaseID, offset int64, done bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkWorker(worker); err != nil {
		return err
	}
	bp := c.scratch()
	*bp = shardwire.AppendReportRequest(*bp, shardwire.ReportRequest{Worker: worker, Lease: lease, Offset: offset, Done: done})
	defer c.bufs.Put(bp)
	return c.statusCall(ctx, "report", methodReport, *bp)
}

// ReportAndAcquire reports worker's lease done at offset, the shard's record count, and leases
// the worker's next shard in one round trip (see shard.ReportAcquirer for what each outcome
// means). A call without an answer returns ErrUnavailable and is safe to repeat: the dispatcher
// recognises the repeat. A server without the call makes it return an error matching
// errors.ErrUnsupported.
func (c *Client) ReportAndAcquire(ctx context.Context, worker string, lease shard.LeaseID, offset int64) (shard.Lease, error) {
	if err := ctx.Err(); err != nil {
		return shard.Lease{}, err
	}
	if err := checkWorker(worker); err != nil {
		return shard.Lease{}, err
	}
	bp := c.scratch()
	*bp = shardwire.AppendReportAcquireRequest(*bp, shardwire.ReportAcquireRequest{Worker: worker, Lease: lease, Offset: offset})
	defer c.bufs.Put(bp)
	const op = "report and acquire"
	resp, addr, err := c.call(ctx, op, methodReportAcquire, *bp)
	if err != nil {
		var re *rpc.RemoteError
		if errors.As(err, &re) && re.Code == rpc.CodeUnknownMethod {
			return shard.Lease{}, fmt.Errorf("shardnet: %s at %s: the server does not know the call: %w", op, addr, errors.ErrUnsupported)
		}
		return shard.Lease{}, err
	}
	r, rest, err := shardwire.DecodeAcquireResponse(resp)
	c.rpc.Release(resp)
	switch {
	case err != nil:
		return shard.Lease{}, protocolError(op, addr, err)
	case len(rest) != 0:
		return shard.Lease{}, protocolError(op, addr, fmt.Errorf("%d trailing bytes", len(rest)))
	case r.Code == shardwire.Canceled:
		return shard.Lease{}, fmt.Errorf("%w: %s at %s: the dispatcher cancelled the call", ErrUnavailable, op, addr)
	}
	return r.Result()
}

// Leave hands every shard of worker back (see shard.Service).
func (c *Client) Leave(ctx context.Context, worker string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkWorker(worker); err != nil {
		return err
	}
	bp := c.scratch()
	*bp = shardwire.AppendLeaveRequest(*bp, shardwire.LeaveRequest{Worker: worker})
	defer c.bufs.Put(bp)
	return c.statusCall(ctx, "leave", methodLeave, *bp)
}

// call makes one call to the current address, waiting at most CallTimeout, and returns the
// response (to Release) and the address, or the client's error for the failure (an error the
// server's RPC layer answered stays in its chain).
func (c *Client) call(ctx context.Context, op string, method uint16, req []byte) ([]byte, string, error) {
	addr := c.Addr()
	if c.isClosed() {
		return nil, addr, c.closedErr(op)
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	resp, err := c.rpc.Call(cctx, addr, method, req)
	timedOut := cctx.Err() != nil
	cancel()
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return nil, addr, ctx.Err()
		case timedOut && !c.isClosed():
			return nil, addr, fmt.Errorf("%w: %s at %s: no answer within %v", ErrUnavailable, op, addr, c.cfg.CallTimeout)
		}
		return nil, addr, c.callError(op, addr, err)
	}
	return resp, addr, nil
}

// statusCall makes a call answered by a shardwire.Status and returns the status's error.
func (c *Client) statusCall(ctx context.Context, op string, method uint16, req []byte) error {
	resp, addr, err := c.call(ctx, op, method, req)
	if err != nil {
		return err
	}
	st, rest, err := shardwire.DecodeStatus(resp)
	c.rpc.Release(resp)
	switch {
	case err != nil:
		return protocolError(op, addr, err)
	case len(rest) != 0:
		return protocolError(op, addr, fmt.Errorf("%d trailing bytes", len(rest)))
	case st.Code == shardwire.Canceled:
		return fmt.Errorf("%w: %s at %s: the dispatcher cancelled the call", ErrUnavailable, op, addr)
	}
	return st.Err()
}

// callError turns a failed RPC into the client's error.
func (c *Client) callError(op, addr string, err error) error {
	var re *rpc.RemoteError
	switch {
	case c.isClosed():
		return c.closedErr(op)
	case errors.As(err, &re) && re.Code == rpc.CodeInternal:
		return fmt.Errorf("%w: %s at %s: %s", shardwire.ErrRemote, op, addr, re.Message)
	case errors.As(err, &re), errors.Is(err, rpc.ErrHandshake), errors.Is(err, rpc.ErrTooLarge):
		return protocolError(op, addr, err)
	case errors.Is(err, rpc.ErrAuth):
		return &permanent{fmt.Errorf("%w: %s at %s: %w", ErrAuth, op, addr, err)}
	}
	return fmt.Errorf("%w: %s at %s: %w", ErrUnavailable, op, addr, err)
}

func protocolError(op, addr string, err error) error {
	return &permanent{fmt.Errorf("%w: %s at %s: %w", ErrProtocol, op, addr, err)}
}

func (c *Client) scratch() *[]byte {
	bp, _ := c.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	*bp = (*bp)[:0]
	return bp
}
