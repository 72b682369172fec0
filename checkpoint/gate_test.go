package checkpoint

import (
	"context"
	"math/rand/v2"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A CopyGate's wait returns only once every copy that entered has left, at once when none is in
// progress, and with the context's error when it ends first.
func TestCopyGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g CopyGate // the zero value is ready
		require.NoError(t, g.wait(context.Background()))
		g.enter()
		g.enter()
		done := make(chan error, 1)
		go func() { done <- g.wait(context.Background()) }()
		synctest.Wait()
		assert.Empty(t, done, "returned while two copies run")
		g.leave()
		synctest.Wait()
		assert.Empty(t, done, "returned while a copy runs")
		g.leave()
		require.NoError(t, <-done)

		g.enter()
		ctx, cancel := context.WithCancel(context.Background())
		go func() { done <- g.wait(ctx) }()
		synctest.Wait()
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		g.leave()
		require.NoError(t, g.wait(context.Background()))
	})
}

// Two Checkpointers share a gate: while one is held mid-copy, the other's snapshot is taken (its
// copy does not wait) but not sealed; it is sealed and persisted once the first copy ends. The
// test runs in a bubble (testing/synctest), so "not sealed" means that every goroutine has
// blocked and the sealer is among those waiting.
func TestSharedGateHoldsSealing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := newCluster(t, NewMemStorage(), 64)
		gate := NewCopyGate()
		tabsA, tsA := tables2()
		tabsB, tsB := tables2()
		rng := rand.New(rand.NewPCG(5, 6))
		fill(rng, tsA, 300, 1<<40)
		fill(rng, tsB, 300, 1<<40)
		cfgA, cfgB := cl.cfg("ps0", tabsA), cl.cfg("ps1", tabsB)
		cfgA.Gate, cfgB.Gate = gate, gate
		a, b := cl.open(cfgA), cl.open(cfgB)

		reached, hold := make(chan struct{}), make(chan struct{})
		tsA[0].copyHook = func() {
			reached <- struct{}{}
			<-hold
		}
		errA := make(chan error, 1)
		go func() {
			_, err := a.Snapshot(context.Background(), 1)
			errA <- err
		}()
		<-reached
		_, err := b.Snapshot(context.Background(), 1)
		require.NoError(t, err, "a copy does not wait for another's")
		synctest.Wait()
		assert.Zero(t, b.Stats().Seals, "ps1 sealed while ps0 copied")
		close(hold)
		require.NoError(t, <-errA)
		_, err = a.WaitPersisted(context.Background(), 1)
		require.NoError(t, err)
		_, err = b.WaitPersisted(context.Background(), 1)
		require.NoError(t, err)
		assert.Equal(t, uint64(1), b.Stats().Seals)
	})
}
