package train

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/internal/ctl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// waitFor waits until cond holds for cs (checked under its lock at every change), or fails the
// test after a while.
func waitFor(t *testing.T, cs *coordService, what string, cond func() bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		cs.mu.Lock()
		ok, ch := cond(), cs.changed
		cs.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("waiting for %s", what)
		}
	}
}

// follow is a worker following the barrier by direct calls: it polls and arrives at every
// barrier, until ctx ends.
func follow(ctx context.Context, cs *coordService, id string) {
	var gen uint64
	for ctx.Err() == nil {
		var r ctl.BarrierReply
		_ = cs.Wait(ctl.Barrier{Worker: id, Gen: gen}, &r)
		gen = r.Gen
		if r.Pause {
			var rel ctl.BarrierReply
			_ = cs.Arrived(ctl.Barrier{Worker: id, Gen: gen}, &rel)
			gen = rel.Gen
		}
		if r.Stop || r.Rejoin {
			return
		}
	}
}

// A worker that crashed (it stopped calling without leaving) holds a barrier up only until it
// has been silent for workerSilence, not barrierTimeout: the barrier then goes on without it,
// and the worker, if it ever calls again, is told to register again.
func TestBarrierDropsSilentWorkers(t *testing.T) {
	f := newFakeNow()
	cs := newCoordService(f.Now, nil)
	for _, id := range []string{"alive", "crashed"} {
		var r ctl.BarrierReply
		require.NoError(t, cs.Join(ctl.Barrier{Worker: id}, &r))
		assert.False(t, r.Pause)
	}
	f.advance(workerSilence) // nothing heard from either since
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go follow(ctx, cs, "alive")
	require.Eventually(t, func() bool {
		cs.mu.Lock()
		defer cs.mu.Unlock()
		return cs.workers["alive"].calls > 0
	}, 10*time.Second, time.Millisecond, "the live worker's poll")

	start := time.Now()
	rctx, rcancel := context.WithTimeout(ctx, barrierTimeout/2)
	defer rcancel()
	gen, err := cs.raise(rctx)
	require.NoError(t, err, "the barrier waited for a crashed worker")
	assert.Less(t, time.Since(start), barrierTimeout/2)
	cs.mu.Lock()
	_, kept := cs.workers["alive"]
	_, dropped := cs.workers["crashed"]
	assert.Equal(t, gen, cs.workers["alive"].arrived)
	cs.mu.Unlock()
	assert.True(t, kept)
	assert.False(t, dropped)
	cs.release(gen)

	var r ctl.BarrierReply
	require.NoError(t, cs.Wait(ctl.Barrier{Worker: "crashed", Gen: gen + 1}, &r))
	assert.True(t, r.Rejoin, "a dropped worker registers again before it applies anything")
	require.NoError(t, cs.Arrived(ctl.Barrier{Worker: "crashed", Gen: gen}, &r))
	assert.True(t, r.Rejoin)
}

// A worker that stopped polling but is still within workerSilence is waited for.
func TestBarrierWaitsForRecentWorkers(t *testing.T) {
	f := newFakeNow()
	cs := newCoordService(f.Now, nil)
	var r ctl.BarrierReply
	require.NoError(t, cs.Join(ctl.Barrier{Worker: "w"}, &r))
	f.advance(workerSilence - time.Millisecond)
	raised := make(chan error, 1)
	go func() {
		_, err := cs.raise(context.Background())
		raised <- err
	}()
	waitFor(t, cs, "the barrier", func() bool { return cs.gen%2 == 1 })
	require.NoError(t, cs.Wait(ctl.Barrier{Worker: "w"}, &r))
	require.True(t, r.Pause)
	select {
	case err := <-raised:
		t.Fatalf("the barrier went up without the worker: %v", err)
	default:
	}
	go cs.Arrived(ctl.Barrier{Worker: "w", Gen: r.Gen}, &ctl.BarrierReply{})
	require.NoError(t, <-raised)
	cs.shutdown()
}

// A worker that failed while applying a batch fails the barrier (and every later one), so no
// checkpoint holds the broken batch.
func TestBarrierFailsAfterAWorkerFailure(t *testing.T) {
	cs := newCoordService(nil, nil)
	var r ctl.BarrierReply
	require.NoError(t, cs.Join(ctl.Barrier{Worker: "w"}, &r))
	raised := make(chan error, 1)
	go func() {
		_, err := cs.raise(context.Background())
		raised <- err
	}()
	waitFor(t, cs, "the barrier", func() bool { return cs.gen%2 == 1 })
	require.NoError(t, cs.Failed(ctl.Failure{Worker: "w", Err: "push: server gone"}, &ctl.Empty{}))
	err := <-raised
	require.ErrorIs(t, err, ErrPartialApply)
	assert.Contains(t, err.Error(), "push: server gone")
	_, err = cs.raise(context.Background())
	require.ErrorIs(t, err, ErrPartialApply)
}

// serveCoord serves cs over an authenticated control channel on a loopback port.
func serveCoord(t *testing.T, cs *coordService, addr string, secret []byte) (*ctl.Server, string) {
	t.Helper()
	srv, err := ctl.NewServer(secret, "Coord", cs)
	require.NoError(t, err)
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return srv, l.Addr().String()
}

// gateOpen reports whether a batch could enter g now.
func gateOpen(g *gate) bool {
	if g.mu.TryRLock() {
		g.mu.RUnlock()
		return true
	}
	return false
}

// A worker that starts while a checkpoint is being taken applies nothing before the snapshot is
// done: its gate opens only once it has registered and arrived at the barrier, and the barrier
// has been released.
func TestNewWorkerRegistersBeforeItsFirstBatch(t *testing.T) {
	secret := []byte("a secret of the test cluster")
	cs := newCoordService(nil, nil)
	_, addr := serveCoord(t, cs, "127.0.0.1:0", secret)
	client := ctl.NewClient(addr, secret)
	defer client.Close()

	gen, err := cs.raise(context.Background()) // no worker yet: up at once; the snapshot runs
	require.NoError(t, err)

	var g gate
	g.close() // as RunWorker starts it
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		followBarrier(ctx, client, "late", &g, cancel, discardLogger())
	}()
	entered := make(chan struct{})
	go func() {
		g.enter() // the worker's first batch
		close(entered)
		g.exit()
	}()
	waitFor(t, cs, "the new worker at the barrier", func() bool {
		w := cs.workers["late"]
		return w != nil && w.arrived == gen
	})
	select {
	case <-entered:
		t.Fatal("a batch was applied during a snapshot that did not wait for its worker")
	default:
	}
	cs.release(gen)
	<-entered
	cs.shutdown() // the job ends: the worker is told to stop
	<-followed
}

// A worker that loses the coordinator closes its gate until it has registered again.
func TestWorkerClosesGateWhenCoordinatorIsLost(t *testing.T) {
	secret := []byte("a secret of the test cluster")
	cs := newCoordService(nil, nil)
	srv, addr := serveCoord(t, cs, "127.0.0.1:0", secret)
	client := ctl.NewClient(addr, secret)
	defer client.Close()
	var g gate
	g.close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		followBarrier(ctx, client, "w", &g, cancel, discardLogger())
	}()
	require.Eventually(t, func() bool { return gateOpen(&g) }, 10*time.Second, time.Millisecond, "registered: the gate opens")

	srv.Close() // the coordinator goes away
	require.Eventually(t, func() bool { return !gateOpen(&g) }, 10*time.Second, time.Millisecond, "lost touch: the gate closes")

	cs2 := newCoordService(nil, nil) // a coordinator comes back on the same address
	serveCoord(t, cs2, addr, secret)
	waitFor(t, cs2, "the worker registering again", func() bool { return cs2.workers["w"] != nil })
	require.Eventually(t, func() bool { return gateOpen(&g) }, 10*time.Second, time.Millisecond, "registered again: the gate opens")

	cs2.shutdown() // the job ends: the worker is told to stop
	<-followed
	assert.True(t, errors.Is(ctx.Err(), context.Canceled))
}

// A worker told to pause keeps polling while it waits for the batch being applied to finish, so
// that a slow apply does not get it dropped as silent (and the snapshot taken under its batch).
func TestClosingTheGateKeepsTheWorkerAlive(t *testing.T) {
	var g gate
	g.enter() // a batch being applied
	beats := make(chan struct{}, 16)
	closed := make(chan struct{})
	go func() {
		closeGate(&g, func() { beats <- struct{}{} })
		close(closed)
	}()
	<-beats
	select {
	case <-closed:
		t.Fatal("the gate closed with a batch inside")
	default:
	}
	g.exit()
	<-closed
	assert.False(t, gateOpen(&g))
	g.open()
}
