package local_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/require"
)

// endless is more data than a test trains: the workers of the contract test never run out.
const endless = 1 << 32

var endlessData = shard.IndexedSource{Data: shard.IndexedFunc(endless, func(i int64, rec *shard.Record) error {
	rec.IDs = append(rec.IDs, uint64(i%97))
	rec.EndField()
	return nil
})}

// startJob starts a local job of servers servers on endless data, closed with the test.
func startJob(t *testing.T, servers int) *local.Job {
	t.Helper()
	job, err := local.Start(context.Background(), local.Config{Job: "local", Servers: servers, Slots: 16,
		Tables: []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 2}}},
		Coordinator: elastic.Config{WorkerSilence: -1,
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(endless), ShardSize: 1 << 20}}})
	require.NoError(t, err)
	t.Cleanup(func() { job.Close() })
	return job
}

// harness runs a Scaler for TestScaler: its workers train endless data with a function that
// takes batchTime and pushes nothing, or fails while the test crashes the worker.
type harness struct {
	job    *local.Job
	scaler *local.Scaler

	mu       sync.Mutex
	crashing map[string]int // the start of each worker that crashes
	changed  chan struct{}  // closed and replaced at every start of a worker
}

func newHarness(t *testing.T, servers int) *harness {
	h := &harness{job: startJob(t, servers), crashing: map[string]int{}, changed: make(chan struct{})}
	var err error
	h.scaler, err = local.NewScaler(local.ScalerConfig{Job: h.job, MaxRestarts: 5,
		Reader: func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: endlessData, BatchSize: 256} },
		Worker: h.worker})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("workers: %+v", h.scaler.Workers())
		}
		h.scaler.Close()
	})
	return h
}

var errCrash = errors.New("the worker crashed")

// batchTime is how long a batch of the contract test's workers trains.
const batchTime = 2 * time.Millisecond

func (h *harness) worker(id string) (local.StepFunc, error) {
	start := 0 // which start of id this is: the scaler counted it before calling here
	for _, w := range h.scaler.Workers() {
		if w.ID == id {
			start = w.Starts
		}
	}
	h.mu.Lock()
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
	return func(ctx context.Context, b *elastic.Batch) error {
		h.mu.Lock()
		crashing := h.crashing[id] == start
		h.mu.Unlock()
		if crashing {
			return errCrash
		}
		// A batch takes a moment to train: workers that trained without pause would keep the
		// coordinator's locks busy, and a stopped one finishes the batch in hand.
		time.Sleep(batchTime)
		return nil
	}, nil
}

// procs is what runs: the job's servers (their incarnations) and the scaler's running
// workers (their starts).
func (h *harness) procs() elastictest.Procs {
	p := elastictest.Procs{}
	for _, s := range h.job.Servers {
		p[s.Node().ID] = strconv.FormatUint(s.Incarnation(), 16)
	}
	for _, w := range h.scaler.Workers() {
		if w.Running {
			p[w.ID] = strconv.Itoa(w.Starts)
		}
	}
	return p
}

// await waits for cond, looking again at every start of a worker (what a crash leads to).
func (h *harness) await(ctx context.Context, cond func(elastictest.Procs) bool) (elastictest.Procs, error) {
	changed := func() <-chan struct{} {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.changed
	}
	return elastictest.AwaitChanges(ctx, changed, h.procs, cond)
}

// crash makes the worker's function fail, in the session it runs now (which may not have begun
// yet), until the scaler starts it again; a server is the job's, restarted by
// Job.RestartServer, not by the scaler.
func (h *harness) crash(ctx context.Context, id string) error {
	if strings.HasPrefix(id, "ps-") {
		return errors.ErrUnsupported
	}
	for _, w := range h.scaler.Workers() {
		if w.ID == id && w.Running {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.crashing[id] = w.Starts
			return nil
		}
	}
	return fmt.Errorf("%s does not run", id)
}

func TestScalerContract(t *testing.T) {
	elastictest.TestScaler(t, func(t *testing.T, servers int) elastictest.ScalerUnderTest {
		h := newHarness(t, servers)
		return elastictest.ScalerUnderTest{Scaler: h.scaler, Await: h.await, Crash: h.crash}
	})
}
