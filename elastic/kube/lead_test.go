package kube_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/kube"
)

// leaderConfig returns short durations, so that a takeover takes a few seconds.
func (e *env) leaderConfig(identity string) kube.LeaderConfig {
	return kube.LeaderConfig{Client: e.cp.Client, Namespace: e.ns, Name: "job", Identity: identity,
		LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 200 * time.Millisecond}
}

// candidate runs Lead in a goroutine: leading receives run's ctx when it starts, and ended
// Lead's result.
type candidate struct {
	cancel  context.CancelFunc
	leading chan context.Context
	ended   chan error
	gone    chan struct{} // closed when Lead has returned
}

func (e *env) candidate(identity string) *candidate {
	ctx, cancel := context.WithCancel(e.ctx)
	c := &candidate{cancel: cancel, leading: make(chan context.Context, 1), ended: make(chan error, 1), gone: make(chan struct{})}
	go func() {
		defer close(c.gone)
		c.ended <- kube.Lead(ctx, e.leaderConfig(identity), func(ctx context.Context) {
			c.leading <- ctx
			<-ctx.Done()
		})
	}()
	e.t.Cleanup(func() { cancel(); <-c.gone })
	return c
}

// Two candidates on one Lease: one leads, the other waits and takes over when the first
// cancels (and releases the lease); a leader whose lease another candidate takes is stopped.
func TestLeadOneAtATime(t *testing.T) {
	e := newEnv(t, nil)
	a := e.candidate("a")
	var actx context.Context
	select {
	case actx = <-a.leading:
	case <-e.ctx.Done():
		t.Fatal("a never led")
	}
	b := e.candidate("b")
	lease, err := e.cp.Client.CoordinationV1().Leases(e.ns).Get(e.ctx, "job", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "a", *lease.Spec.HolderIdentity)
	select {
	case <-b.leading:
		t.Fatal("b leads while a holds the lease")
	default:
	}

	// a steps down: it releases the lease, and b takes it without waiting for it to expire.
	start := time.Now()
	a.cancel()
	require.NoError(t, <-a.ended)
	assert.Error(t, actx.Err(), "a's run was cancelled")
	lease, err = e.cp.Client.CoordinationV1().Leases(e.ns).Get(e.ctx, "job", metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotEqual(t, "a", *lease.Spec.HolderIdentity, "a released the lease when it stepped down")
	var bctx context.Context
	select {
	case bctx = <-b.leading:
	case <-e.ctx.Done():
		t.Fatal("b never took over")
	}
	t.Logf("b took over %v after a released the lease", time.Since(start).Round(time.Millisecond))

	// c forces the lease over to itself: b cannot renew it, its run ends, and Lead says why.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error { // b renews meanwhile
		lease, err := e.cp.Client.CoordinationV1().Leases(e.ns).Get(e.ctx, "job", metav1.GetOptions{})
		require.NoError(t, err)
		require.Equal(t, "b", *lease.Spec.HolderIdentity)
		c, later := "c", metav1.NewMicroTime(time.Now().Add(time.Second))
		lease.Spec.HolderIdentity, lease.Spec.RenewTime, lease.Spec.AcquireTime = &c, &later, &later
		_, err = e.cp.Client.CoordinationV1().Leases(e.ns).Update(e.ctx, lease, metav1.UpdateOptions{})
		return err
	})
	require.NoError(t, err)
	select {
	case <-bctx.Done():
	case <-e.ctx.Done():
		t.Fatal("b's run went on after its lease was taken")
	}
	assert.ErrorIs(t, <-b.ended, kube.ErrLeaseLost)
	lease, err = e.cp.Client.CoordinationV1().Leases(e.ns).Get(e.ctx, "job", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "c", *lease.Spec.HolderIdentity, "the lost lease is not released over its new holder")
}

func TestLeaderConfigValidate(t *testing.T) {
	err := kube.LeaderConfig{LeaseDuration: time.Second, RenewDeadline: 2 * time.Second}.Validate()
	require.ErrorIs(t, err, elastic.ErrInvalidConfig)
	for _, want := range []string{"Client", "Namespace", "Identity", "LeaseDuration"} {
		assert.ErrorContains(t, err, want)
	}
	assert.ErrorIs(t, kube.Lead(context.Background(), kube.LeaderConfig{}, func(context.Context) {}), elastic.ErrInvalidConfig)
}

// Lead releases the lease only once run has returned, and returns after both: run, told to
// stop, still holds the lease while it winds down (the next leader may not act for the job
// yet), and the lease is released when Lead returns.
func TestLeadWaitsForRun(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	cfg := e.leaderConfig("a")
	leading := make(chan struct{})
	var returned atomic.Bool
	releasedEarly := false
	ended := make(chan bool, 1)
	go func() {
		err := kube.Lead(ctx, cfg, func(ctx context.Context) {
			close(leading)
			<-ctx.Done()
			// An early release comes at once: half of RenewDeadline (within which the
			// release waits for run) is long enough a wind-down to see one.
			wctx, wcancel := context.WithTimeout(e.ctx, cfg.RenewDeadline/2)
			defer wcancel()
			w, err := e.cp.Client.CoordinationV1().Leases(e.ns).Watch(wctx, metav1.ListOptions{FieldSelector: "metadata.name=job"})
			if assert.NoError(t, err) {
				for ev := range w.ResultChan() {
					if l, ok := ev.Object.(*coordinationv1.Lease); ok && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "a") {
						releasedEarly = true
						break
					}
				}
				w.Stop()
			}
			returned.Store(true)
		})
		assert.NoError(t, err)
		ended <- returned.Load()
	}()
	select {
	case <-leading:
	case <-e.ctx.Done():
		t.Fatal("never led")
	}
	cancel()
	assert.True(t, <-ended, "run had returned when Lead did")
	assert.False(t, releasedEarly, "the lease is held until run returns")
	lease, err := e.cp.Client.CoordinationV1().Leases(e.ns).Get(e.ctx, "job", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "a", "the lease is released once run returned")
}

// A run that returns by itself (the job is done) ends Lead with nil and releases the lease at
// once: the next candidate leads without waiting for the lease to expire.
func TestLeadEndsWhenRunReturns(t *testing.T) {
	e := newEnv(t, nil)
	cfg := e.leaderConfig("a")
	cfg.LeaseDuration, cfg.RenewDeadline = time.Minute, 30*time.Second // an expiry would fail the test
	ran := false
	require.NoError(t, kube.Lead(e.ctx, cfg, func(ctx context.Context) { ran = true }))
	assert.True(t, ran)
	lease, err := e.cp.Client.CoordinationV1().Leases(e.ns).Get(e.ctx, "job", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "a", "the lease is released")

	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	next := cfg
	next.Identity = "b"
	led := false
	require.NoError(t, kube.Lead(ctx, next, func(context.Context) { led = true }))
	assert.True(t, led, "the next candidate leads at once")
}

// A leader whose run takes longer than LeaseDuration to stop after its ctx ended keeps the
// lease until run returns: the next candidate never leads while it still acts for the job.
func TestLeadHoldsTheLeaseUntilASlowRunStops(t *testing.T) {
	e := newEnv(t, nil)
	actx, acancel := context.WithCancel(e.ctx)
	defer acancel()
	var acting atomic.Bool
	leading := make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		aDone <- kube.Lead(actx, e.leaderConfig("a"), func(ctx context.Context) {
			acting.Store(true)
			close(leading)
			<-ctx.Done()
			// The wind-down of a slow coordinator: twice LeaseDuration.
			t := time.NewTimer(2 * e.leaderConfig("a").LeaseDuration)
			defer t.Stop()
			select {
			case <-t.C:
			case <-e.ctx.Done():
			}
			acting.Store(false)
		})
	}()
	select {
	case <-leading:
	case <-e.ctx.Done():
		t.Fatal("a never led")
	}
	bctx, bcancel := context.WithCancel(e.ctx)
	defer bcancel()
	bLed := make(chan bool, 1)
	bDone := make(chan error, 1)
	go func() {
		bDone <- kube.Lead(bctx, e.leaderConfig("b"), func(ctx context.Context) {
			bLed <- acting.Load()
		})
	}()
	acancel()
	select {
	case whileActing := <-bLed:
		assert.False(t, whileActing, "b led while a's run still acted for the job")
	case <-e.ctx.Done():
		t.Fatal("b never led")
	}
	assert.NoError(t, <-aDone)
	assert.NoError(t, <-bDone)
}
