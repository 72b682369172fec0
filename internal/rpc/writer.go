package rpc

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/internal/wire"
)

// coalesceMax is the largest payload copied into the write batch next to its
// header; larger payloads are written from the sender's slice by a vectored
// write (writev on TCP), without copying.
const coalesceMax = 8 << 10

// maxKeptBatch is the largest batch buffer kept for reuse after a flush.
const maxKeptBatch = 1 << 20

// queuer is told, under the writer's lock, the id its frame is about to be
// queued with; an error keeps the frame out.
type queuer interface {
	queued(id uint64) error
}

// batch is frames waiting to be written: headers and small payloads copied
// into buf, large payloads referenced, large[i] going right after
// buf[:cuts[i]]. On a protected connection each payload is followed in buf
// by a TagSize placeholder, and frames records where each frame's parts
// are, so that the flusher seals them in the order they go on the wire.
type batch struct {
	buf    []byte
	cuts   []int
	large  [][]byte
	frames []frameRef
	sealed [][]byte // pool buffers holding ciphertexts of large payloads
	held   int      // bytes its senders counted against their connection (see send)
	vec    net.Buffers
	wv     net.Buffers // consumed by WriteTo; a field so that it does not escape
}

// frameRef locates a queued frame in a batch.
type frameRef struct {
	hdr   int // offset of the header in buf
	small int // offset of the payload in buf, or -1 if it is large[li]
	li    int
	tag   int // offset of the tag placeholder in buf
}

var noTag [wire.TagSize]byte

func (b *batch) empty() bool { return len(b.buf) == 0 }

func (b *batch) reset(pool *wire.Pool) {
	if cap(b.buf) > maxKeptBatch {
		b.buf = nil
	}
	b.buf = b.buf[:0]
	b.cuts = b.cuts[:0]
	clear(b.large)
	b.large = b.large[:0]
	b.frames = b.frames[:0]
	for _, s := range b.sealed {
		pool.Put(s)
	}
	clear(b.sealed)
	b.sealed = b.sealed[:0]
	clear(b.vec[:cap(b.vec)])
	b.vec = b.vec[:0]
}

// seal protects every frame of the batch, in order, with p: tags go into
// their placeholders, small payloads are encrypted in place, large ones
// into buffers from pool that replace them in the batch.
func (b *batch) seal(p *wire.Protector, pool *wire.Pool) {
	for _, f := range b.frames {
		hdr := b.buf[f.hdr : f.hdr+wire.HeaderSize]
		switch {
		case f.small >= 0 && p.Encrypts():
			p.Seal(b.buf[f.small:f.small], hdr, b.buf[f.small:f.tag])
		case f.small >= 0:
			p.Seal(b.buf[f.tag:f.tag], hdr, b.buf[f.small:f.tag])
		case p.Encrypts():
			n := len(b.large[f.li])
			ct := pool.Get(n + wire.TagSize)
			out := p.Seal(ct[:0], hdr, b.large[f.li])
			copy(b.buf[f.tag:], out[n:])
			b.large[f.li] = out[:n]
			b.sealed = append(b.sealed, ct)
		default:
			p.Seal(b.buf[f.tag:f.tag], hdr, b.large[f.li])
		}
	}
}

// frameWriter puts whole frames on a connection. Senders append their frame
// to the current batch; whoever finds no flush in progress becomes the
// flusher and writes batches until none is left, so frames sent
// concurrently leave in one system call. A frame with a large payload waits
// to become the flusher itself, so that its payload is written before send
// returns and never copied.
//
// On a protected connection the flusher seals each batch, frame by frame
// in wire order, just before writing it: the sending direction's frame
// counter advances in exactly the order frames go out, and the cost of a
// large frame's tag falls on its own sender, which flushes it.
//
// A write that is still in progress after between timeout and twice that
// (checked by a timer, so that writes need no clock reads) fails the
// connection; so does any write error. Either is reported once through
// onFail, which must close the connection.
type frameWriter struct {
	nc      net.Conn
	onFail  func(error)
	timeout time.Duration
	prot    *wire.Protector // owned by the flusher; nil when unprotected
	pool    *wire.Pool      // ciphertext buffers of large payloads
	// release, if set, is given back the bytes senders declared held by
	// their frames, once those frames are written or dropped.
	release func(n int)

	mu       sync.Mutex
	flushing bool
	idle     chan struct{} // closed when the current flush ends; nil if nobody waits
	err      error         // sticky: the first write error
	nextID   uint64        // ids for senders with a queuer
	cur, out batch         // out is owned by the flusher while it writes

	// interruption of a flush by its flusher's context
	imu     sync.Mutex
	active  uint64 // token of the interruptible flush in progress, 0 if none
	tokens  uint64
	dirtyDL bool // the write deadline was set to the past: clear it before writing
	// dirtyTok is the flush whose cancellation set it: that flush's own writes must keep it.
	dirtyTok uint64
	// beforeWrite, if set (tests), runs at the start of every write.
	beforeWrite func()

	// watchdog
	writing  atomic.Uint64 // sequence number of the write in progress, 0 if none
	wseq     uint64        // owned by the flusher
	lastSeen atomic.Uint64 // the write in progress at the previous check
	tmu      sync.Mutex
	timer    *time.Timer
	stopped  bool
}

// newFrameWriter returns a writer of frames on nc, sealed with prot unless
// it is nil (pool supplies ciphertext buffers then).
func newFrameWriter(nc net.Conn, timeout time.Duration, prot *wire.Protector, pool *wire.Pool, onFail func(error)) *frameWriter {
	w := &frameWriter{nc: nc, onFail: onFail, timeout: timeout, prot: prot, pool: pool, nextID: 1}
	if timeout > 0 {
		w.timer = time.AfterFunc(timeout, w.watch)
	}
	return w
}

// stop ends the watchdog. Call it when the connection is closed.
func (w *frameWriter) stop() {
	w.tmu.Lock()
	defer w.tmu.Unlock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

func (w *frameWriter) watch() {
	cur := w.writing.Load()
	if cur != 0 && cur == w.lastSeen.Load() {
		w.fail(fmt.Errorf("write made no progress for %v", w.timeout))
		return
	}
	w.lastSeen.Store(cur)
	w.tmu.Lock()
	defer w.tmu.Unlock()
	if !w.stopped {
		w.timer.Reset(w.timeout)
	}
}

// fail records err as the writer's sticky error, if it is the first, and
// reports it.
func (w *frameWriter) fail(err error) {
	w.mu.Lock()
	first := w.err == nil
	if first {
		w.err = err
	}
	w.mu.Unlock()
	if first {
		w.onFail(err)
	}
}

// send writes one frame. If q is not nil the frame gets the next id of this
// connection (ids leave in increasing order), and q.queued is called with it
// before the frame is queued. payload is not used after send returns. A
// small frame may still be waiting in the batch when send returns nil (a
// concurrent flusher writes it); a later failure then surfaces as the
// connection's failure. An error means the frame was not (completely)
// written: the connection's sticky error, q's error, or ctx's error if ctx
// ended while the frame waited for its turn or was being written. ctx may
// be nil. held is a count of bytes the caller holds for the frame; the
// writer gives it to w.release once the frame is written, or dropped
// because the connection failed (at once if send fails before queuing).
func (w *frameWriter) send(ctx context.Context, h wire.Header, payload []byte, q queuer, held int) error {
	queued := false
	defer func() {
		if !queued {
			w.settle(held)
		}
	}()
	h.Size = uint32(len(payload))
	small := len(payload) <= coalesceMax
	if ctx != nil {
		// A sender whose context already ended must not become the
		// flusher: its context would interrupt other senders' frames.
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	w.mu.Lock()
	for !small && w.flushing && w.err == nil {
		if w.idle == nil {
			w.idle = make(chan struct{})
		}
		ch := w.idle
		w.mu.Unlock()
		if err := waitCtx(ctx, ch); err != nil {
			return err
		}
		w.mu.Lock()
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	if q != nil {
		if err := q.queued(w.nextID); err != nil {
			w.mu.Unlock()
			return err
		}
		h.ID = w.nextID
		w.nextID++
	}
	b := &w.cur
	queued = true
	b.held += held
	ref := frameRef{hdr: len(b.buf), small: -1}
	b.buf = wire.AppendHeader(b.buf, h)
	if small {
		ref.small = len(b.buf)
		b.buf = append(b.buf, payload...)
	} else {
		ref.li = len(b.large)
		b.cuts = append(b.cuts, len(b.buf))
		b.large = append(b.large, payload)
	}
	if w.prot != nil {
		ref.tag = len(b.buf)
		b.buf = append(b.buf, noTag[:]...)
		b.frames = append(b.frames, ref)
	}
	if w.flushing {
		w.mu.Unlock()
		return nil
	}
	w.flushing = true
	w.mu.Unlock()
	return w.flush(ctx)
}

// settle gives n held bytes back through w.release.
func (w *frameWriter) settle(n int) {
	if n != 0 && w.release != nil {
		w.release(n)
	}
}

// drop empties b, settling what its frames held.
func (w *frameWriter) drop(b *batch) {
	w.settle(b.held)
	b.held = 0
	b.reset(w.pool)
}

func waitCtx(ctx context.Context, ch <-chan struct{}) error {
	if ctx == nil {
		<-ch
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flush writes batches until none is left. The caller has set w.flushing.
// It returns the error of the first batch, the one holding the caller's
// frame.
func (w *frameWriter) flush(ctx context.Context) error {
	if ctx != nil && ctx.Done() != nil {
		w.imu.Lock()
		w.tokens++
		tok := w.tokens
		w.active = tok
		w.imu.Unlock()
		stop := context.AfterFunc(ctx, func() {
			w.imu.Lock()
			defer w.imu.Unlock()
			if w.active == tok {
				w.dirtyDL, w.dirtyTok = true, tok
				_ = w.nc.SetWriteDeadline(time.Unix(1, 0))
			}
		})
		defer func() {
			w.imu.Lock()
			w.active = 0
			w.imu.Unlock()
			stop()
		}()
	}
	var first error
	for round := 0; ; round++ {
		w.mu.Lock()
		if w.err != nil || w.cur.empty() {
			if round == 0 && w.err != nil {
				first = w.err
			}
			w.drop(&w.cur)
			w.flushing = false
			if w.idle != nil {
				close(w.idle)
				w.idle = nil
			}
			w.mu.Unlock()
			return first
		}
		w.cur, w.out = w.out, w.cur
		w.mu.Unlock()
		err := w.writeOut()
		w.drop(&w.out)
		if err != nil {
			if round == 0 {
				first = err
				if ctx != nil && ctx.Err() != nil {
					first = ctx.Err()
				}
			}
			w.fail(fmt.Errorf("write: %w", err))
		}
	}
}

// writeOut seals w.out if the connection is protected and writes it in one
// vectored write.
func (w *frameWriter) writeOut() error {
	if w.prot != nil {
		w.out.seal(w.prot, w.pool)
	}
	if w.beforeWrite != nil {
		w.beforeWrite()
	}
	w.imu.Lock()
	// A deadline an earlier flush's cancellation left is cleared; one this flush's own
	// cancellation set (it may fire before the first write) stays, or the write would block.
	if w.dirtyDL && (w.active == 0 || w.dirtyTok != w.active) {
		w.dirtyDL = false
		_ = w.nc.SetWriteDeadline(time.Time{})
	}
	w.imu.Unlock()
	b := &w.out
	prev := 0
	for i, cut := range b.cuts {
		b.vec = append(b.vec, b.buf[prev:cut], b.large[i])
		prev = cut
	}
	if prev < len(b.buf) {
		b.vec = append(b.vec, b.buf[prev:])
	}
	w.wseq++
	w.writing.Store(w.wseq)
	var err error
	if len(b.vec) == 1 {
		_, err = w.nc.Write(b.vec[0])
	} else {
		b.wv = b.vec
		_, err = b.wv.WriteTo(w.nc)
		b.wv = nil
	}
	w.writing.Store(0)
	return err
}
