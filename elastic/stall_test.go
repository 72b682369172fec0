package elastic_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/embedding"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two live servers stall past ServerTimeout (a loaded machine, a long pause): they are failed,
// though nothing is wrong with their processes, and then answer again as the incarnations the
// coordinator admitted. Nothing restarts a live process, so no new incarnation ever comes: the
// recovery takes each back as its own replacement at once, instead of waiting ReplaceWait (an
// hour here, on a clock that stands still) for one. Under Rollback every server reloads the
// commit and every record is trained once; under Partial the two servers' slots reload it, and
// exactly the updates counted lost are missing from them: nothing trained on them since the
// commit is kept, nothing applied twice.
func TestStalledServersAreTakenBack(t *testing.T) {
	for _, policy := range []elastic.RecoveryPolicy{elastic.Rollback, elastic.Partial} {
		t.Run(policy.String(), func(t *testing.T) { testStalledServers(t, policy) })
	}
}

func testStalledServers(t *testing.T, policy elastic.RecoveryPolicy) {
	clock := elastictest.NewClock(time.Unix(1_700_000_000, 0))
	faults := map[string]*elastictest.FaultServer{}
	recovered := make(chan elastic.RecoveryEvent, 4)
	j := startFaultJobWith(t, 3, checkpoint.NewMemStorage(), t.TempDir(), func(c *elastic.Config) {
		c.Recovery = policy
		c.Now = clock.Now
		c.Dispatcher.MaxFailures = 1 // a voided batch is no fault of its shard
		c.HealthEvery = 5 * time.Millisecond
		c.ServerTimeout = time.Second
		c.ReplaceWait = time.Hour
		c.OnRecovery = func(ev elastic.RecoveryEvent) { recovered <- ev }
		for i, s := range c.Servers {
			f := elastictest.NewFaultServer(s)
			faults[s.Node().ID], c.Servers[i] = f, f
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	table, err := j.coord.OwnerTable(ctx, 0)
	require.NoError(t, err)
	stalled := embedding.NewSlotSet(faultSlots)
	for _, id := range []string{"ps-1", "ps-2"} {
		for _, s := range table.SlotsOf(id).Members() {
			stalled.Add(s)
		}
	}

	// The first worker to begin a batch some steps after a commit stalls ps-1 and ps-2: their
	// health calls time out while the clock moves past ServerTimeout, until the coordinator
	// has failed both; then they answer again.
	var mu sync.Mutex
	n, stalledAt := 0, uint64(0)
	stall := func() error {
		var rules []*elastictest.Fault
		for _, id := range []string{"ps-1", "ps-2"} {
			rules = append(rules, faults[id].Inject(elastictest.Rule{Method: elastictest.MethodHealth, Err: context.DeadlineExceeded}))
		}
		// A health round ends before the next begins: once each rule has refused a call, every
		// answer of a round before is judged, on the clock as it was.
		for _, r := range rules {
			if _, err := r.Wait(ctx, 1); err != nil {
				return err
			}
		}
		clock.Advance(time.Second + time.Millisecond)
		for hits := len(rules[1].Hits()) + 1; j.coord.Status().ServerFailures < 2; hits++ {
			// Until both are failed, each round asks both (the monitor, or the recovery's
			// probe), and judges the round before.
			if _, err := rules[1].Wait(ctx, hits); err != nil {
				return err
			}
		}
		for id, f := range faults {
			if id != "ps-0" {
				f.Clear()
			}
		}
		return nil
	}
	step := func(ctx context.Context, b *elastic.Batch) error {
		mu.Lock()
		n++
		if st := j.coord.Status(); n >= 10 && stalledAt == 0 && st.LastCommit > 0 && st.Step > st.LastSnapshot+3 {
			stalledAt = st.Step
			if err := stall(); err != nil {
				mu.Unlock()
				return err
			}
		}
		mu.Unlock()
		return trainStep(ctx, b)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, name := range []string{"w0", "w1", "w2"} {
		w := j.worker(name)
		wg.Go(func() { errs[i] = w.run(ctx, step) })
	}
	var ev elastic.RecoveryEvent
	select {
	case ev = <-recovered:
	case <-ctx.Done():
		t.Fatalf("no recovery: %+v", j.coord.Status())
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "worker %d went on through the recovery", i)
	}
	require.NotZero(t, stalledAt, "the servers stalled (the workers trained %d batches)", n)
	_, err = j.coord.Checkpoint(ctx)
	require.NoError(t, err)

	require.NoError(t, ev.Err)
	assert.Equal(t, policy, ev.Policy)
	assert.Equal(t, []string{"ps-1", "ps-2"}, ev.Returned, "each taken back as its own replacement")
	assert.Empty(t, ev.Replaced)
	assert.Zero(t, ev.Replacement, "no wait for a replacement (the clock stood still)")
	assert.Positive(t, ev.Step, "restored from a commit")
	st := j.coord.Status()
	assert.Equal(t, 1, st.Recoveries)
	now, err := j.coord.OwnerTable(ctx, 0)
	require.NoError(t, err)
	for _, id := range []string{"ps-1", "ps-2"} {
		assert.Equal(t, table.SlotsOf(id).Members(), now.SlotsOf(id).Members(), "%s kept its slots", id)
	}
	t.Logf("%s: stalled at step %d, restored step %d, lost %d of %d records", policy, stalledAt, ev.Step, ev.LostRecords, ev.TrainedRecords)

	assertEveryEpochOnce(t, j.coord)
	want := faultExpected()
	switch policy {
	case elastic.Rollback:
		assert.Zero(t, ev.LostRecords)
		assert.Equal(t, want, serverRows(j.liveServers()), "every row holds every record once per epoch")
	case elastic.Partial:
		assert.Equal(t, ev.LostRecords, withoutLost(want, ev.Lost, stalled))
		assert.Equal(t, want, serverRows(j.liveServers()), fmt.Sprintf("every row holds every record once per epoch, but the %d lost on the stalled servers' slots", ev.LostRecords))
	}
}
