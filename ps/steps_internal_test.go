package ps

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/embedding"

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
		if !hasDuplicateNames(b) {
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
	require.Equal(t, int64(1), b.hold(1))
	// Step 2 has not begun: worker 1's push is checked (each time it wakes), then waits.
	checked, admitted := make(chan struct{}), make(chan struct{})
	var checkedOnce sync.Once
	push(1, 2, func(counting bool) error {
		if counting {
			close(admitted)
		} else {
			checkedOnce.Do(func() { close(checked) })
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
	go func() { holdDone <- b.holdAfter(ctx, 1, 1) }()
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
	b.release(1, 1)
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
	assert.Equal(t, int64(-1), b.hold(3))
	require.NoError(t, b.holdAfter(ctx, 3, -1))
	b.release(3, 7)
	b.hold(4)
	require.NoError(t, b.holdAfter(ctx, 4, 7), "steps up to the boundary need nothing from this server")
	b.release(4, -1)
	err := b.push(ctx, 0, 7, nil, nil, nil, func([]uint64, []float32, uint32) error { return nil })
	assert.ErrorContains(t, err, "already applied")
	require.NoError(t, b.push(ctx, 0, 8, nil, nil, nil, func([]uint64, []float32, uint32) error { return nil }))
}

// A hold that ends (or is replaced) is over for good: its second round fails instead of
// holding the barrier again, and a late end of it leaves a later hold alone.
func TestBarrierHoldGenerations(t *testing.T) {
	ctx := context.Background()
	b := newBarrier(2)
	apply := func([]uint64, []float32, uint32) error { return nil }
	counted := make(chan struct{})
	pushed := make(chan error, 1)
	go func() {
		pushed <- b.push(ctx, 0, 1, nil, nil, func(bool) error { close(counted); return nil }, apply)
	}()
	<-counted
	require.Equal(t, int64(1), b.hold(1))
	waiting := make(chan error, 1)
	go func() { waiting <- b.holdAfter(ctx, 1, 1) }() // step 1 needs worker 1, which never comes
	b.release(1, -1)
	assert.ErrorIs(t, <-waiting, errHoldEnded, "a round 2 waiting when its hold ends stops")
	assert.ErrorIs(t, b.holdAfter(ctx, 1, 1), errHoldEnded, "an ended hold is not taken up again")
	b.mu.Lock()
	assert.False(t, b.held)
	b.mu.Unlock()

	b.hold(2)
	b.release(1, -1) // late: hold 1 is over
	b.mu.Lock()
	assert.True(t, b.held, "a late end of hold 1 ended hold 2")
	b.mu.Unlock()
	b.release(2, -1)
	require.NoError(t, b.push(ctx, 1, 1, nil, nil, nil, apply))
	require.NoError(t, <-pushed)
}

// A server's hold ends by generation: a round 2 or an end of an earlier hold is refused or
// ignored, and round 2 of a hold that ends while it waits fails without marking a boundary.
func TestServerHoldGenerations(t *testing.T) {
	ctx := context.Background()
	s, err := NewServer(ServerConfig{ID: "a", Secret: []byte("an internal test secret of 32 B."), Slots: 16, SyncWorkers: 2,
		Tables: []TableSpec{{Name: "emb", Config: embedding.Config{Dim: 2}}}})
	require.NoError(t, err)
	defer s.Close()
	hold := func() uint64 {
		a := s.holdSteps()
		require.Equal(t, byte(1), a[0])
		return binary.LittleEndian.Uint64(a[1:])
	}
	g1 := hold()
	g2 := hold() // replaces hold 1
	assert.NotEqual(t, g1, g2)
	assert.Error(t, s.holdStepsAfter(ctx, g1, nil), "round 2 of a replaced hold")
	assert.False(t, s.releaseSteps(g1, 0, nil), "the end of a replaced hold")
	require.NoError(t, s.holdStepsAfter(ctx, g2, nil))
	assert.True(t, s.steps.boundary.Load())
	assert.True(t, s.releaseSteps(g2, 0, nil))
	assert.False(t, s.steps.boundary.Load())

	// A step begun and not complete: round 2 waits for it, and fails when the hold ends.
	h := s.own.tables["emb"]
	go h.bar.push(ctx, 0, 5, nil, nil, nil, func([]uint64, []float32, uint32) error { return nil })
	for h.bar.begunStep() != 5 {
		runtime.Gosched()
	}
	g3 := hold()
	done := make(chan error, 1)
	go func() { done <- s.holdStepsAfter(ctx, g3, map[string]int64{"emb": 5}) }()
	for {
		h.bar.mu.Lock()
		waiting := h.bar.limit == 5
		h.bar.mu.Unlock()
		if waiting {
			break
		}
		runtime.Gosched()
	}
	assert.True(t, s.releaseSteps(g3, 0, nil))
	assert.Error(t, <-done)
	assert.False(t, s.steps.boundary.Load(), "no boundary was reached")
	h.bar.mu.Lock()
	assert.False(t, h.bar.held, "the barrier is free again")
	h.bar.mu.Unlock()
}

// A push held by one hold that sees the next one begin before it runs is checked again: routed
// by a table that is no longer current, it is refused instead of staying held (it could keep a
// step its client would send elsewhere from completing).
func TestBarrierRechecksAcrossHolds(t *testing.T) {
	ctx := context.Background()
	b := newBarrier(1)
	apply := func([]uint64, []float32, uint32) error { return nil }
	require.NoError(t, b.push(ctx, 0, 1, nil, nil, nil, apply))
	b.hold(1)
	stale := errors.New("routed by an old table")
	var current atomic.Bool
	current.Store(true)
	checks := make(chan struct{}, 8)
	pushed := make(chan error, 1)
	go func() {
		pushed <- b.push(ctx, 0, 2, nil, nil, func(counting bool) error {
			checks <- struct{}{}
			if !current.Load() {
				return stale
			}
			return nil
		}, apply)
	}()
	<-checks             // held
	current.Store(false) // the hold installs a table that routes step 2 elsewhere
	b.mu.Lock()
	b.held = false // the end of hold 1 and the start of hold 2, before the push runs
	b.holdGen, b.held, b.limit = 2, true, 1
	b.signalLocked()
	b.mu.Unlock()
	assert.ErrorIs(t, <-pushed, stale)
	b.release(2, -1)
}
