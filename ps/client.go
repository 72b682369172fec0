package ps

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/internal/wait"
	"golang.org/x/sync/errgroup"
)

// Client pulls and pushes rows for a worker. It routes every id by its cached owner table,
// folds repeated ids of a batch into one row (summing their gradients on push), sends one request
// per server in parallel, reassembles results in the caller's order, and when a server answers
// that it no longer owns a slot, refreshes the table and resends only that server's part. A
// client with a stale table is therefore never wrong, only slower. Safe for concurrent use.
type Client struct {
	cfg      ClientConfig
	log      *slog.Logger
	rpc      *rpc.Client
	resolver Resolver
	table    atomic.Pointer[OwnerTable]
	epoch    atomic.Uint64 // fence epoch carried by every push
	refresh  sync.Mutex
	pool     sync.Pool // *clientScratch
	bufs     sync.Pool // *[]byte request buffers
	closed   atomic.Bool
}

// NewClient returns a client. It connects lazily.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	rc := rpc.ClientConfig{
		Secret: cfg.Secret, Logger: cfg.Logger, ConnsPerAddr: cfg.ConnsPerAddr,
		Compression: cfg.Compression, MaxFrameSize: 256 << 20, Protection: cfg.Protection, TLS: cfg.TLS,
	}
	if cfg.Transport != nil {
		rc.Transport = cfg.Transport
	}
	r, err := rpc.NewClient(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	c := &Client{cfg: cfg, log: cfg.Logger, rpc: r, resolver: cfg.Resolver}
	if c.resolver == nil {
		c.resolver = &serversResolver{c: c, addrs: cfg.Servers}
	}
	return c, nil
}

// Close closes the client's connections. It is idempotent.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return c.rpc.Close()
}

// SetEpoch sets the fence epoch every later push carries (a coordinator issues it when the
// worker joins; 0, the default, is none).
func (c *Client) SetEpoch(epoch uint64) { c.epoch.Store(epoch) }

// Epoch returns the fence epoch pushes carry.
func (c *Client) Epoch() uint64 { return c.epoch.Load() }

// OwnerTable returns the client's owner table, fetching one if it has none.
func (c *Client) OwnerTable(ctx context.Context) (*OwnerTable, error) {
	if t := c.table.Load(); t != nil {
		return t, nil
	}
	return c.refreshTable(ctx, 0)
}

// refreshTable asks the resolver for a table of at least minVersion and keeps the newest seen.
func (c *Client) refreshTable(ctx context.Context, minVersion uint64) (*OwnerTable, error) {
	c.refresh.Lock()
	defer c.refresh.Unlock()
	if t := c.table.Load(); t != nil && t.Version >= minVersion && minVersion > 0 {
		return t, nil // another call refreshed meanwhile
	}
	t, err := c.resolver.OwnerTable(ctx, minVersion)
	if err != nil {
		return nil, err
	}
	if cur := c.table.Load(); cur == nil || t.Version >= cur.Version {
		c.table.Store(t)
		return t, nil
	}
	return c.table.Load(), nil
}

// clientScratch is per-call working memory.
type clientScratch struct {
	uniq  []uint64 // distinct ids in first-seen order
	hash  []uint64 // uniq index -> idHash of the id, which routes it
	at    []int32  // caller position -> uniq index
	first []int32  // uniq index -> first caller position (with links)
	last  []int32  // uniq index -> last caller position (with links, while deduplicating)
	next  []int32  // caller position -> next position of the same id, or -1 (with links)
	slots []int32  // dedupe hash table: uniq index + 1, 0 for empty
	idx   []int32  // the uniq indices a call sends first: all of them
	by    [][]int32
	parts []part

	// A pull holds every response until all parts have arrived, then fills dst in caller order.
	mu    sync.Mutex
	resps [][]byte // responses held, each released once when the pull ends
	where []uint64 // uniq index -> response index<<32 | byte offset of its row (frames are < 4 GiB)
}

func (c *Client) scratch() *clientScratch {
	sc, _ := c.pool.Get().(*clientScratch)
	if sc == nil {
		sc = &clientScratch{}
	}
	return sc
}

// dedupe fills sc.uniq with the distinct ids in first-seen order, sc.hash with their hashes and
// sc.at with the uniq index of each position; with links also sc.first with the first position
// of each distinct id and sc.next with the next position of the same id (-1 ends the list). The
// table is probed by probeHash of the id, and its entries are uniq indices (compared through
// sc.uniq) so that it stays small; only distinct ids get the idHash that routes them.
func (sc *clientScratch) dedupe(ids []uint64, links bool) {
	shift := 4
	for 1<<shift < 2*len(ids) {
		shift++
	}
	size := 1 << shift
	if cap(sc.slots) < size {
		sc.slots = make([]int32, size)
	}
	slots := sc.slots[:size]
	clear(slots)
	sc.uniq, sc.hash, sc.first, sc.last = sc.uniq[:0], sc.hash[:0], sc.first[:0], sc.last[:0]
	if cap(sc.at) < len(ids) {
		sc.at = make([]int32, len(ids))
	}
	at := sc.at[:len(ids)]
	sc.at = at
	if links {
		if cap(sc.next) < len(ids) {
			sc.next = make([]int32, len(ids))
		}
		sc.next = sc.next[:len(ids)]
	}
	mask := uint64(size - 1)
	for i, id := range ids {
		for k := probeHash(id) >> (64 - shift); ; k = (k + 1) & mask {
			e := slots[k]
			if e == 0 {
				sc.uniq = append(sc.uniq, id)
				sc.hash = append(sc.hash, idHash(id))
				slots[k] = int32(len(sc.uniq))
				at[i] = int32(len(sc.uniq) - 1)
				if links {
					sc.next[i] = -1
					sc.first = append(sc.first, int32(i))
					sc.last = append(sc.last, int32(i))
				}
				break
			}
			if sc.uniq[e-1] == id {
				at[i] = e - 1
				if links {
					sc.next[i] = -1
					sc.next[sc.last[e-1]] = int32(i)
					sc.last[e-1] = int32(i)
				}
				break
			}
		}
	}
}

// probeHash mixes id for the dedupe table (the splitmix64 finaliser): a multiplicative hash alone
// is linear, and ids in arithmetic progression, which synthetic ids often are, would pile up in
// one run of the table.
func probeHash(id uint64) uint64 {
	id ^= id >> 30
	id *= 0xbf58476d1ce4e5b9
	id ^= id >> 27
	id *= 0x94d049bb133111eb
	return id ^ id>>31
}

// hold keeps resp, a pull's answer for the distinct ids at idx, until release, and records
// where each of their rows is. A part resent after a refusal overwrites the records of its ids.
// Parts call it concurrently; their idx are disjoint.
func (sc *clientScratch) hold(resp []byte, idx []int32, rowBytes int) {
	sc.mu.Lock()
	r := uint64(len(sc.resps)) << 32
	sc.resps = append(sc.resps, resp)
	sc.mu.Unlock()
	for k, i := range idx {
		sc.where[i] = r | uint64(k*rowBytes)
	}
}

// gather fills dst in caller order from the responses held: each position gets the row of its
// id, so dst is written sequentially.
func (sc *clientScratch) gather(dst []float32, dim int) {
	rowBytes := 4 * dim
	resps, where := sc.resps, sc.where
	for q, u := range sc.at {
		w := where[u]
		off := int(uint32(w))
		getFloats(dst[q*dim:(q+1)*dim], resps[w>>32][off:off+rowBytes])
	}
}

// release hands every response held back to rc, once.
func (sc *clientScratch) release(rc *rpc.Client) {
	for _, b := range sc.resps {
		rc.Release(b)
	}
	clear(sc.resps)
	sc.resps = sc.resps[:0]
}

// buffer returns a request buffer from the client's pool; put it back with putBuffer.
func (c *Client) buffer() *[]byte {
	if b, ok := c.bufs.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 1<<16)
	return &b
}

func (c *Client) putBuffer(b *[]byte) {
	*b = (*b)[:0]
	c.bufs.Put(b)
}

// part is one server's share of a call: indices into the distinct ids.
type part struct {
	node Node
	idx  []int32
}

// split groups the distinct ids at idx by owner in t; with all, every node gets a part, empty ones
// included (synchronous pushes must reach every server). The parts live in sc until the next
// split.
func (sc *clientScratch) split(t *OwnerTable, idx []int32, all bool) []part {
	n := len(t.Nodes)
	if cap(sc.by) < n {
		sc.by = make([][]int32, n)
	}
	by := sc.by[:n]
	for o := range by {
		by[o] = by[o][:0]
	}
	for _, i := range idx {
		o := t.OwnerIndex(hashSlot(sc.hash[i], t.Slots))
		by[o] = append(by[o], i)
	}
	parts := sc.parts[:0]
	for o, nd := range t.Nodes {
		if all || len(by[o]) > 0 {
			parts = append(parts, part{node: nd, idx: by[o]})
		}
	}
	sc.parts = parts
	return parts
}

// PullOption adjusts one Pull.
type PullOption func(*tableReq)

// ReadOnly makes a pull create no rows: ids without a row read their initial value and are not
// stored or counted for admission. Use it to evaluate a model without growing it.
func ReadOnly() PullOption { return func(r *tableReq) { r.flags |= flagReadOnly } }

// Pull fills dst (len(ids)*dim floats; dim is the table's) with the rows of ids from table.
func (c *Client) Pull(ctx context.Context, table string, ids []uint64, dst []float32, opts ...PullOption) error {
	if len(ids) == 0 || len(dst)%len(ids) != 0 {
		if len(ids) == 0 && len(dst) == 0 {
			return nil
		}
		return fmt.Errorf("%w: pull of %d ids into %d floats", ErrBadRequest, len(ids), len(dst))
	}
	dim := len(dst) / len(ids)
	sc := c.scratch()
	defer c.pool.Put(sc)
	sc.dedupe(ids, false)
	if cap(sc.where) < len(sc.uniq) {
		sc.where = make([]uint64, len(sc.uniq))
	}
	sc.where = sc.where[:len(sc.uniq)]
	rowBytes := 4 * dim
	err := c.route(ctx, sc, false, true, true, func(ctx context.Context, t *OwnerTable, p part) error {
		buf := c.buffer()
		defer c.putBuffer(buf)
		hdr := tableReq{version: t.Version, dim: uint32(dim), table: table}
		for _, o := range opts {
			o(&hdr)
		}
		req := appendReqHeader(*buf, &hdr, len(p.idx))
		req, idb := grow(req, 8*len(p.idx))
		putIDsAt(idb, sc.uniq, p.idx)
		*buf = req
		resp, err := c.rpc.Call(ctx, p.node.Addr, methodPull, req)
		if err != nil {
			return err
		}
		if len(resp) != rowBytes*len(p.idx) {
			c.rpc.Release(resp)
			return fmt.Errorf("%w: pull answer of %d bytes for %d rows of %d", ErrBadRequest, len(resp), len(p.idx), dim)
		}
		sc.hold(resp, p.idx, rowBytes)
		return nil
	})
	if err == nil {
		sc.gather(dst, dim)
	}
	sc.release(c.rpc)
	if err != nil {
		return fmt.Errorf("pull %q: %w", table, err)
	}
	return nil
}

// Push applies one optimizer step to the rows of ids in table with gradients grads
// (len(ids)*dim). step is the worker's training step (stamped on the rows). Every push carries
// the client's fence epoch (SetEpoch). A push that fails at any server returns an error (wrapping
// ErrPartialPush when other servers applied their parts); it is never reported as success. A NaN
// or infinite gradient fails the whole push before anything is sent. A push marked with its
// batch's position (At) is applied at most once per slot, so it is also resent after a lost
// connection, and resending it after an error is safe.
func (c *Client) Push(ctx context.Context, table string, ids []uint64, grads []float32, step uint64, opts ...PushOption) error {
	if (len(ids) == 0) != (len(grads) == 0) || (len(ids) > 0 && len(grads)%len(ids) != 0) {
		return fmt.Errorf("%w: push of %d ids with %d gradient floats", ErrBadRequest, len(ids), len(grads))
	}
	if len(ids) == 0 && !c.cfg.Sync {
		return nil
	}
	if i := embedding.FirstNonFinite(grads); i >= 0 {
		return fmt.Errorf("push %q: %w: gradient %d is %v", table, ErrNonFinite, i, grads[i])
	}
	dim := 0
	if len(ids) > 0 {
		dim = len(grads) / len(ids)
	}
	var o pushOpts
	for _, opt := range opts {
		opt(&o)
	}
	if o.hasPos && !o.pos.valid() {
		return fmt.Errorf("push %q: %w: position %v", table, ErrBadRequest, o.pos)
	}
	hdr := tableReq{step: step, epoch: c.epoch.Load(), worker: uint32(c.cfg.Worker), dim: uint32(dim), table: table}
	if o.hasPos {
		hdr.pos, hdr.flags = o.pos, flagPosition
	}
	sc := c.scratch()
	defer c.pool.Put(sc)
	sc.dedupe(ids, true)
	rowBytes := 4 * dim
	err := c.route(ctx, sc, c.cfg.Sync, false, o.hasPos && !c.cfg.Sync, func(ctx context.Context, t *OwnerTable, p part) error {
		buf := c.buffer()
		defer c.putBuffer(buf)
		h := hdr
		h.version = t.Version
		req := appendReqHeader(*buf, &h, len(p.idx))
		req, idb := grow(req, 8*len(p.idx))
		putIDsAt(idb, sc.uniq, p.idx)
		req, out := grow(req, rowBytes*len(p.idx))
		*buf = req
		// The gradients of repeated ids are summed into the request.
		var sum []float32
		for k, i := range p.idx {
			dstRow := out[rowBytes*k : rowBytes*(k+1)]
			q := sc.first[i]
			g := grads[int(q)*dim : int(q+1)*dim]
			if sc.next[q] >= 0 {
				if sum == nil {
					sum = make([]float32, dim)
				}
				copy(sum, g)
				for q = sc.next[q]; q >= 0; q = sc.next[q] {
					for j, v := range grads[int(q)*dim : int(q+1)*dim] {
						sum[j] += v
					}
				}
				g = sum
			}
			putFloats(dstRow, g)
		}
		resp, err := c.rpc.Call(ctx, p.node.Addr, methodPush, req)
		c.rpc.Release(resp)
		return err
	})
	if err != nil {
		return fmt.Errorf("push %q: %w", table, err)
	}
	return nil
}

// route sends each server its part of the distinct ids (sc.uniq) in parallel, and resends the parts
// refused for a stale table after refreshing it. Idempotent calls (pulls) are cancelled
// together on the first error; other calls (pushes) run every part to completion so the error
// tells what was applied. Parts are resent after a lost connection only with resend (pulls,
// and pushes the servers apply at most once); otherwise only when the server surely did not
// process them.
func (c *Client) route(ctx context.Context, sc *clientScratch, all, idempotent, resend bool, send func(ctx context.Context, t *OwnerTable, p part) error) error {
	if c.closed.Load() {
		return ErrClosed
	}
	t, err := c.OwnerTable(ctx)
	if err != nil {
		return err
	}
	if cap(sc.idx) < len(sc.uniq) {
		sc.idx = make([]int32, len(sc.uniq))
	}
	idx := sc.idx[:len(sc.uniq)]
	for i := range idx {
		idx[i] = int32(i)
	}
	applied := 0
	backoff := c.cfg.RetryBackoff
	fence := fenceWait{budget: c.cfg.FenceWait}
	for attempt := 0; ; {
		parts := sc.split(t, idx, all)
		errs := make([]error, len(parts))
		sendParts(ctx, parts, errs, c.cfg.Parallel, idempotent, func(ctx context.Context, i int) bool {
			p := parts[i]
			err := send(ctx, t, p)
			if err != nil {
				err = mapErr(p.node.Addr, err)
			}
			errs[i] = err
			return err != nil && !retryable(err, resend)
		})
		var again []int32
		var maxVer uint64
		var fatal, last error
		for i, err := range errs {
			switch {
			case err == nil:
				applied++
			case retryable(err, resend):
				again = append(again, parts[i].idx...)
				last = err
				maxVer = max(maxVer, announcedVersion(err))
			case fatal == nil || errors.Is(fatal, context.Canceled):
				fatal = err
			}
		}
		behind := serverBehind(errs, t.Version)
		waiting := (maxVer > t.Version || behind) && fence.spent < fence.budget
		if fatal == nil && len(again) > 0 && ((all && applied > 0) || (attempt+1 >= c.cfg.Retries && !waiting) || ctx.Err() != nil) {
			// A synchronous step is not resent in part: its barrier counts one push per worker.
			// Refused everywhere (its table changed between steps), it is resent whole.
			fatal = last
			if ctx.Err() != nil {
				fatal = ctx.Err()
			}
		}
		if fatal != nil {
			if !idempotent && applied > 0 {
				return fmt.Errorf("%w: %w", ErrPartialPush, fatal)
			}
			return fatal
		}
		if len(again) == 0 {
			return nil
		}
		if all {
			idx = sc.idx[:len(sc.uniq)]
		} else {
			idx = again
		}
		if maxVer <= t.Version {
			c.reportUnreachable(ctx, last)
		}
		prev := t.Version
		if t, err = c.nextTable(ctx, t, maxVer, behind, &backoff, &fence); err != nil {
			return err
		}
		if t.Version <= prev && !((maxVer > prev || behind) && fence.spent < fence.budget) {
			attempt++ // neither a newer table nor a fence to wait out: a retry spent
		}
		c.log.Debug("retrying", "version", t.Version, "ids", len(idx))
	}
}

// sendParts runs send for every part, at most parallel at once, the last part on the calling
// goroutine: a call whose batch one server holds starts no goroutine. send reports a failure
// that should stop the call; with cancelOnFail that cancels the context the other parts run
// with.
func sendParts(ctx context.Context, parts []part, errs []error, parallel int, cancelOnFail bool, send func(ctx context.Context, i int) bool) {
	if len(parts) == 0 {
		return
	}
	last := len(parts) - 1
	if last == 0 {
		send(ctx, 0)
		return
	}
	cancel := context.CancelFunc(func() {})
	if cancelOnFail {
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
	}
	run := func(i int) {
		if send(ctx, i) {
			cancel()
		}
	}
	if parallel <= 1 {
		for i := range parts {
			run(i)
		}
		return
	}
	var g errgroup.Group
	g.SetLimit(parallel - 1) // the caller runs the last part
	for i := range parts[:last] {
		g.Go(func() error { run(i); return nil })
	}
	run(last)
	g.Wait()
}

// announcedVersion is the owner-table version a refusal says exists: the refusing server's
// for a wrong owner, the one above it for a moved slot (the move is published above it); 0 for
// other errors.
func announcedVersion(err error) uint64 {
	var we *WrongOwnerError
	var me *MovedError
	switch {
	case errors.As(err, &we):
		return we.Version
	case errors.As(err, &me):
		return me.Version + 1
	}
	return 0
}

// fenceWait paces the waits for a newer owner table that a server announced (a slot moved, or
// a server ahead of the resolver): short pauses, doubling from 250µs to 8ms, within a budget
// for the whole call.
type fenceWait struct {
	budget, spent, pause time.Duration
}

// wait pauses once and reports false, without pausing, when the budget is spent.
func (f *fenceWait) wait(ctx context.Context) (bool, error) {
	if f.spent >= f.budget {
		return false, nil
	}
	f.pause = min(max(2*f.pause, 250*time.Microsecond), 8*time.Millisecond, f.budget-f.spent)
	if err := wait.Sleep(ctx, f.pause); err != nil {
		return false, err
	}
	f.spent += f.pause
	return true, nil
}

// Unreachable reports whether err says a server could not be reached at all (as opposed to an
// answer, even a refusal), and which: its *ServerError.
func Unreachable(err error) (*ServerError, bool) {
	var se *ServerError
	if !errors.As(err, &se) || !errors.Is(se.Err, rpc.ErrUnavailable) && !errors.Is(se.Err, rpc.ErrConnClosed) {
		return nil, false
	}
	return se, true
}

// reportUnreachable tells a resolver that wants to know (UnreachableReporter) of the server err
// names, when err says it could not be reached.
func (c *Client) reportUnreachable(ctx context.Context, err error) {
	r, ok := c.resolver.(UnreachableReporter)
	se, down := Unreachable(err)
	if ok && down {
		r.Unreachable(ctx, se.Server, se.Err)
	}
}

// serverBehind reports whether the refusals in errs are all answers (no server unreachable) and
// one came from a server on an older table than version: it is about to install a newer one.
func serverBehind(errs []error, version uint64) bool {
	behind := false
	for _, err := range errs {
		if _, down := Unreachable(err); down {
			return false
		}
		var we *WrongOwnerError
		if errors.As(err, &we) && we.Version < version {
			behind = true
		}
	}
	return behind
}

// nextTable returns the table to retry with after refusals. A server on a newer table than t
// (maxVer > t.Version) means t is stale: fetch a newer one at once. A server behind this client
// (behind) is installing t: wait briefly (within the fence budget) and resend. Otherwise a
// server was unreachable: wait (doubling *backoff), then take the newest table the resolver has.
func (c *Client) nextTable(ctx context.Context, t *OwnerTable, maxVer uint64, behind bool, backoff *time.Duration, fence *fenceWait) (*OwnerTable, error) {
	if behind && maxVer <= t.Version {
		if ok, err := fence.wait(ctx); err != nil || ok {
			return t, err
		}
	}
	if maxVer > t.Version {
		// A server knows of a newer table than t, or is handing a slot over: take the newer
		// table, or wait briefly (within the fence budget) and take what the resolver has then.
		// The caller resends either way: a move may also be called off without a new table.
		nt, err := c.refreshTable(ctx, maxVer)
		if err != nil || nt.Version >= maxVer {
			return nt, err
		}
		if _, err := fence.wait(ctx); err != nil {
			return nil, err
		}
		return c.refreshTable(ctx, maxVer)
	}
	{
		if err := wait.Sleep(ctx, *backoff); err != nil {
			return nil, err
		}
		*backoff *= 2
		// Anything newer than t: the unreachable server may have been replaced in a new table.
		return c.refreshTable(ctx, t.Version+1)
	}
}

// retryable says whether a failed part may be sent again: always after a wrong-owner refusal
// or a call the server never processed; for idempotent calls also after a lost connection.
func retryable(err error, idempotent bool) bool {
	if errors.Is(err, ErrWrongOwner) || errors.Is(err, ErrMoved) || errors.Is(err, rpc.ErrUnavailable) {
		return true
	}
	return idempotent && errors.Is(err, rpc.ErrConnClosed)
}

// mapErr turns a call's error into the package's errors, naming the server.
func mapErr(addr string, err error) error {
	var re *rpc.RemoteError
	if !errors.As(err, &re) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return &ServerError{Server: addr, Err: err}
	}
	switch re.Code {
	case codeWrongOwner:
		we := &WrongOwnerError{Server: addr}
		if len(re.Data) >= 12 {
			we.Version = binary.LittleEndian.Uint64(re.Data)
			if slot := binary.LittleEndian.Uint32(re.Data[8:]); slot == math.MaxUint32 {
				we.Slot = -1
			} else {
				we.Slot = int(slot)
			}
		}
		return we
	case codeMoved:
		me := &MovedError{Server: addr}
		if len(re.Data) >= 12 {
			me.Version = binary.LittleEndian.Uint64(re.Data)
			me.Slot = int(binary.LittleEndian.Uint32(re.Data[8:]))
			me.To = string(re.Data[12:])
		}
		return me
	case codeMigration:
		return &ServerError{Server: addr, Err: fmt.Errorf("%w: %s", ErrMigration, re.Message)}
	case codeUnknownTable:
		return &ServerError{Server: addr, Err: fmt.Errorf("%w: %s", ErrUnknownTable, re.Message)}
	case codeFenced:
		return &ServerError{Server: addr, Err: fmt.Errorf("%w: %s", ErrFenced, re.Message)}
	case codeNonFinite:
		return &ServerError{Server: addr, Err: fmt.Errorf("%w: %s", ErrNonFinite, re.Message)}
	case codeClosed:
		return &ServerError{Server: addr, Err: fmt.Errorf("%w: %s", rpc.ErrUnavailable, re.Message)}
	case codeBadRequest:
		return &ServerError{Server: addr, Err: fmt.Errorf("%w: %s", ErrBadRequest, re.Message)}
	}
	return &ServerError{Server: addr, Err: err}
}

// Stats returns the report of the server at addr; withRows also counts rows per slot.
func (c *Client) Stats(ctx context.Context, addr string, withRows bool) (ServerStats, error) {
	var st ServerStats
	req := []byte{0}
	if withRows {
		req[0] = 1
	}
	resp, err := c.rpc.Call(ctx, addr, methodStats, req)
	if err != nil {
		return st, mapErr(addr, err)
	}
	defer c.rpc.Release(resp)
	if err := json.Unmarshal(resp, &st); err != nil {
		return st, fmt.Errorf("%w: stats from %s: %w", ErrCorrupt, addr, err)
	}
	return st, nil
}
