package ps

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzDecodeSteps: any input decodes or is refused with errShort, never panics, and what
// decodes re-encodes to the same bytes.
func FuzzDecodeSteps(f *testing.F) {
	f.Add(appendSteps(nil, map[string]int64{"emb": 41, "mlp": -1}))
	f.Add(appendSteps(nil, nil))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeSteps(b)
		if err != nil {
			require.True(t, errors.Is(err, errShort), "%v", err)
			return
		}
		if len(m) == int(uint32(len(m))) && !hasDuplicateNames(b) {
			require.Equal(t, b, appendSteps(nil, m))
		}
	})
}

// hasDuplicateNames reports whether the encoded steps name a table twice or out of order (then
// the map keeps one entry and re-encodes sorted).
func hasDuplicateNames(b []byte) bool {
	d := decoder{b: b}
	n := d.u32()
	prev := ""
	for i := range n {
		name := d.str()
		d.u64()
		if i > 0 && name <= prev {
			return true
		}
		prev = name
	}
	return false
}

// A held barrier keeps pushes of steps that have not begun waiting, lets those of begun steps
// in, refuses at once a push its admit check refuses, and after a release admits the waiting
// pushes.
func TestBarrierHold(t *testing.T) {
	ctx := context.Background()
	b := newBarrier(2)
	applied := map[uint32]int{}
	apply := func(ids []uint64, g []float32, step uint32) error { applied[step]++; return nil }
	pushed := make(chan error, 4)
	push := func(w, step uint32, admit func(bool) error) {
		go func() { pushed <- b.push(ctx, w, step, nil, nil, admit, apply) }()
	}
	// Step 1 begins (worker 0, counted before the hold), so the hold lets step 1 in.
	counted := make(chan struct{})
	push(0, 1, func(bool) error { close(counted); return nil })
	<-counted
	require.Equal(t, int64(1), b.hold())
	// Step 2 has not begun: worker 1's push is checked, then waits.
	checked, admitted := make(chan struct{}), make(chan struct{})
	push(1, 2, func(counting bool) error {
		if counting {
			close(admitted)
		} else {
			close(checked)
		}
		return nil
	})
	select {
	case <-checked:
	case <-time.After(time.Minute):
		t.Fatal("a push of a step that had not begun did not wait for the hold")
	}
	stale := errors.New("routed by an old table")
	assert.Equal(t, stale, b.push(ctx, 0, 2, nil, nil, func(bool) error { return stale }, apply), "a stale push is refused without waiting")
	// Round 2: step 1 completes; step 2 still waits.
	holdDone := make(chan error, 1)
	go func() { holdDone <- b.holdAfter(ctx, 1) }()
	push(1, 1, nil)
	require.NoError(t, <-holdDone)
	require.NoError(t, <-pushed)
	require.NoError(t, <-pushed)
	assert.Equal(t, map[uint32]int{1: 2}, applied)
	select {
	case <-admitted:
		t.Fatal("a push of step 2 was admitted during the hold")
	default:
	}
	// Release: step 2 is admitted; with worker 0's push it completes.
	b.release(1)
	<-admitted
	push(0, 2, nil)
	require.NoError(t, <-pushed)
	require.NoError(t, <-pushed)
	assert.Equal(t, map[uint32]int{1: 2, 2: 2}, applied)
}

// A server that joins a synchronous table at a boundary counts the boundary's steps as done:
// its first step is the next one, and a late push of an earlier step is refused.
func TestBarrierReleaseAtBoundaryOfNewServer(t *testing.T) {
	ctx := context.Background()
	b := newBarrier(1)
	assert.Equal(t, int64(-1), b.hold())
	require.NoError(t, b.holdAfter(ctx, -1))
	b.release(7)
	require.NoError(t, b.holdAfter(ctx, 7), "steps up to the boundary need nothing from this server")
	b.release(-1)
	err := b.push(ctx, 0, 7, nil, nil, nil, func([]uint64, []float32, uint32) error { return nil })
	assert.ErrorContains(t, err, "already applied")
	require.NoError(t, b.push(ctx, 0, 8, nil, nil, nil, func([]uint64, []float32, uint32) error { return nil }))
}
