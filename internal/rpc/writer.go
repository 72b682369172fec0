package rpc

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/elasticps/elasticps/internal/wire"
)

// coalesceMax is the largest payload copied next to its header so that the
// frame goes out in one Write; larger payloads are written from the caller's
// slice with a vectored write (writev on TCP), without copying.
const coalesceMax = 8 << 10

var errConnDead = errors.New("connection is closed")

// frameWriter serialises whole frames onto a connection. Exactly one
// goroutine writes at a time: the one holding the lock (a channel, so that
// waiting for it can be abandoned). The fields below sem are guarded by it.
type frameWriter struct {
	nc      net.Conn
	timeout time.Duration
	sem     chan struct{}

	small []byte // header and a small payload, coalesced
	hdr   [wire.HeaderSize]byte
	pair  [2][]byte
	vec   net.Buffers

	// imu guards active, the token of the write a context may interrupt.
	imu    sync.Mutex
	active uint64
	seq    uint64
}

func newFrameWriter(nc net.Conn, timeout time.Duration) *frameWriter {
	return &frameWriter{nc: nc, timeout: timeout, sem: make(chan struct{}, 1)}
}

// lock waits for the write lock, giving up when ctx is done (if ctx is not
// nil) or when dead is closed.
func (w *frameWriter) lock(ctx context.Context, dead <-chan struct{}) error {
	select {
	case w.sem <- struct{}{}:
		return nil
	default:
	}
	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	select {
	case w.sem <- struct{}{}:
		return nil
	case <-done:
		return ctx.Err()
	case <-dead:
		return errConnDead
	}
}

func (w *frameWriter) unlock() { <-w.sem }

// write sends one frame; the caller holds the lock. payload is read until
// write returns and never kept. It returns how many bytes of the frame were
// written: any error with n > 0 leaves a partial frame on the wire, and the
// connection must be closed. If ctx is done while the frame is being
// written, the write is interrupted.
func (w *frameWriter) write(ctx context.Context, h wire.Header, payload []byte) (int64, error) {
	h.Size = uint32(len(payload))
	var dl time.Time
	if w.timeout > 0 {
		dl = time.Now().Add(w.timeout)
	}
	if err := w.nc.SetWriteDeadline(dl); err != nil {
		return 0, err
	}
	if ctx != nil && ctx.Done() != nil {
		w.imu.Lock()
		w.seq++
		tok := w.seq
		w.active = tok
		w.imu.Unlock()
		stop := context.AfterFunc(ctx, func() {
			w.imu.Lock()
			if w.active == tok {
				_ = w.nc.SetWriteDeadline(time.Unix(1, 0))
			}
			w.imu.Unlock()
		})
		defer func() {
			w.imu.Lock()
			w.active = 0
			w.imu.Unlock()
			stop()
		}()
	}
	if len(payload) <= coalesceMax {
		b := wire.AppendHeader(w.small[:0], h)
		b = append(b, payload...)
		w.small = b
		n, err := w.nc.Write(b)
		return int64(n), err
	}
	wire.PutHeader(w.hdr[:], h)
	w.pair = [2][]byte{w.hdr[:], payload}
	w.vec = w.pair[:]
	n, err := w.vec.WriteTo(w.nc)
	w.pair = [2][]byte{}
	w.vec = nil
	return n, err
}
