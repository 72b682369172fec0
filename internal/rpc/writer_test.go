package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/internal/wire"
)

func memPair(t *testing.T, window int) (a, b net.Conn) {
	t.Helper()
	n := memnet.New(memnet.Config{Window: window})
	l, err := n.Host("b").Listen("b:1")
	require.NoError(t, err)
	a, err = n.Host("a").Dial(context.Background(), "b:1")
	require.NoError(t, err)
	b, err = l.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close(); _ = b.Close(); _ = l.Close() })
	return a, b
}

// payloadFor is a deterministic payload for a frame id, small or large.
func payloadFor(id uint64) []byte {
	n := int(id*7919) % (3 * coalesceMax)
	if id%5 == 0 {
		n += 100 << 10
	}
	p := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(p[i:], id*1_000_003+uint64(i))
	}
	return p
}

// writerProtectors returns the sending and receiving Protectors of one
// direction for protection p (nil, nil for ProtectNone).
func writerProtectors(t *testing.T, p Protection) (send, recv *wire.Protector) {
	t.Helper()
	if p == ProtectNone {
		return nil, nil
	}
	key := bytes.Repeat([]byte{7}, wire.KeySize)
	send, err := wire.NewProtector(key, p == ProtectEncrypt)
	require.NoError(t, err)
	recv, err = wire.NewProtector(key, p == ProtectEncrypt)
	require.NoError(t, err)
	return send, recv
}

func TestFrameWriterConcurrentSenders(t *testing.T) {
	for _, prot := range []Protection{ProtectNone, ProtectIntegrity, ProtectEncrypt} {
		t.Run(prot.String(), func(t *testing.T) {
			a, b := memPair(t, 64<<10)
			send, recv := writerProtectors(t, prot)
			failed := make(chan error, 1)
			var pool wire.Pool
			w := newFrameWriter(a, time.Minute, send, &pool, func(err error) { failed <- err })
			defer w.stop()
			const senders, each = 8, 40
			got := make(chan wire.Frame, senders*each)
			readErr := make(chan error, 1)
			go func() {
				rd := wire.NewReader(b, wire.ReaderOptions{Protector: recv})
				for range senders * each {
					f, err := rd.ReadFrame()
					if err != nil {
						readErr <- err
						return
					}
					got <- f
				}
			}()
			var wg sync.WaitGroup
			for s := range senders {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						id := uint64(s*each + i + 1)
						p := payloadFor(id)
						if !assert.NoError(t, w.send(nil, wire.Header{Kind: wire.KindResponse, ID: id}, p, nil, 0)) {
							return
						}
						clear(p) // the writer must be done with it
					}
				}()
			}
			wg.Wait()
			seen := map[uint64]bool{}
			for range senders * each {
				var f wire.Frame
				select {
				case f = <-got:
				case err := <-readErr:
					t.Fatalf("reading: %v", err)
				}
				require.False(t, seen[f.ID], "frame %d twice", f.ID)
				seen[f.ID] = true
				require.True(t, bytes.Equal(payloadFor(f.ID), f.Payload), "frame %d corrupted", f.ID)
			}
			assert.Empty(t, failed)
		})
	}
}

type idRecorder struct {
	mu  *sync.Mutex
	ids *[]uint64
}

func (r idRecorder) queued(id uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.ids = append(*r.ids, id)
	return nil
}

func TestFrameWriterIDsLeaveInOrder(t *testing.T) {
	a, b := memPair(t, 1<<20)
	w := newFrameWriter(a, 0, nil, nil, func(error) {})
	defer w.stop()
	var mu sync.Mutex
	var queued []uint64
	const total = 200
	done := make(chan []uint64)
	go func() {
		rd := wire.NewReader(b, wire.ReaderOptions{})
		var ids []uint64
		for range total {
			f, err := rd.ReadFrame()
			if err != nil {
				break
			}
			ids = append(ids, f.ID)
		}
		done <- ids
	}()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range total / 4 {
				p := payloadFor(uint64(g*1000 + i))
				if !assert.NoError(t, w.send(context.Background(), wire.Header{Kind: wire.KindRequest, Method: 1}, p, idRecorder{&mu, &queued}, 0)) {
					return
				}
			}
		}()
	}
	wg.Wait()
	ids := <-done
	require.Len(t, ids, total)
	for i := range ids {
		assert.Equal(t, uint64(i+1), ids[i])
	}
	assert.Equal(t, ids, queued)
}

type refuse struct{}

func (refuse) queued(uint64) error { return errDraining }

func TestFrameWriterQueuerRefuses(t *testing.T) {
	a, _ := memPair(t, 1<<20)
	w := newFrameWriter(a, 0, nil, nil, func(error) {})
	defer w.stop()
	assert.ErrorIs(t, w.send(nil, wire.Header{Kind: wire.KindRequest}, []byte("x"), refuse{}, 0), errDraining)
	assert.True(t, w.cur.empty())
}

func TestFrameWriterWatchdog(t *testing.T) {
	a, _ := memPair(t, 1024) // nobody reads: writes block once 1 KiB is buffered
	failed := make(chan error, 1)
	w := newFrameWriter(a, 20*time.Millisecond, nil, nil, func(err error) {
		failed <- err
		_ = a.Close()
	})
	defer w.stop()
	err := w.send(nil, wire.Header{Kind: wire.KindResponse, ID: 1}, make([]byte, 64<<10), nil, 0)
	require.Error(t, err)
	assert.Contains(t, (<-failed).Error(), "no progress")
	// The error is sticky.
	assert.Error(t, w.send(nil, wire.Header{Kind: wire.KindResponse, ID: 2}, []byte("x"), nil, 0))
}

func TestFrameWriterContextInterrupts(t *testing.T) {
	a, _ := memPair(t, 1024)
	failed := make(chan error, 1)
	w := newFrameWriter(a, 0, nil, nil, func(err error) { failed <- err; _ = a.Close() })
	defer w.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := w.send(ctx, wire.Header{Kind: wire.KindResponse, ID: 1}, make([]byte, 64<<10), nil, 0)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Error(t, <-failed)

	// A large frame waiting for its turn behind a stuck flush gives up on
	// its own context without breaking anything further.
	a2, _ := memPair(t, 1024)
	w2 := newFrameWriter(a2, 0, nil, nil, func(error) { _ = a2.Close() })
	defer w2.stop()
	stuck := make(chan error, 1)
	go func() {
		stuck <- w2.send(nil, wire.Header{Kind: wire.KindResponse, ID: 1}, make([]byte, 64<<10), nil, 0)
	}()
	waitFor(t, func() bool { return w2.writing.Load() != 0 }, "the first write to block")
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	err = w2.send(ctx2, wire.Header{Kind: wire.KindResponse, ID: 2}, make([]byte, 64<<10), nil, 0)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	_ = a2.Close()
	assert.True(t, errors.Is(<-stuck, net.ErrClosed))
}

// A flush whose context ends before its first write (between registering its interruption and
// writing) is still interrupted: the deadline its cancellation set is not cleared as if an
// earlier flush had left it, so the write does not block on a peer that reads nothing.
func TestFrameWriterContextEndsBeforeTheWrite(t *testing.T) {
	a, _ := memPair(t, 1024)
	w := newFrameWriter(a, 0, nil, nil, func(error) { _ = a.Close() })
	defer w.stop()
	ctx, cancel := context.WithCancel(context.Background())
	w.beforeWrite = func() {
		cancel()
		waitFor(t, func() bool {
			w.imu.Lock()
			defer w.imu.Unlock()
			return w.dirtyDL
		}, "the cancellation to set the deadline")
	}
	done := make(chan error, 1)
	go func() { done <- w.send(ctx, wire.Header{Kind: wire.KindResponse, ID: 1}, make([]byte, 64<<10), nil, 0) }()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		_ = a.Close()
		t.Fatal("the write blocked after its context ended")
	}
}
