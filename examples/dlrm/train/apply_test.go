package train

import (
	"context"
	"fmt"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// setUpRun sets up a small embedded cluster (servers, dispatcher, checkpoints) without workers.
func setUpRun(t *testing.T, cfg Config) *run {
	t.Helper()
	require.NoError(t, cfg.Validate())
	cfg.fill()
	r := &run{cfg: cfg, logger: discardLogger(), ledger: newLedger(), clock: newPausableClock(nil)}
	t.Cleanup(func() { r.close() })
	require.NoError(t, r.setUp(context.Background()))
	return r
}

func tinyConfig(t *testing.T) Config {
	return Config{
		Synth: model.SynthConfig{DenseFeatures: 2, Vocab: []int{10, 100}}, TrainRecords: 512, TestRecords: 100,
		EmbeddingDim: 4, BottomHidden: []int{4}, TopHidden: []int{4}, BatchSize: 64, ShardSize: 128,
		Servers: 1, Workers: 1, EvalEvery: -1, CheckpointDir: t.TempDir(), ShmDir: t.TempDir(),
	}
}

// stuckReports holds every progress report until release is closed, then fails it.
type stuckReports struct {
	shard.Service
	reporting chan struct{}
	release   chan struct{}
}

func (s *stuckReports) Report(ctx context.Context, worker string, id shard.LeaseID, offset int64, done bool) error {
	s.reporting <- struct{}{}
	<-s.release
	return fmt.Errorf("report lost: %w", shard.ErrPermanent)
}

// A batch whose report fails after its pushes were applied breaks the gate before the worker
// leaves it: a checkpoint waiting for the gate, and every later one, is refused, since the model
// holds updates the dispatcher did not count.
func TestFailedApplyIsNeverCheckpointed(t *testing.T) {
	r := setUpRun(t, tinyConfig(t))
	ctx := context.Background()
	svc := &stuckReports{Service: r.disp, reporting: make(chan struct{}), release: make(chan struct{})}
	reader, err := shard.NewReader(shard.ReaderConfig{Service: svc, Worker: "w", Source: r.data.source, BatchSize: 64})
	require.NoError(t, err)
	defer reader.Close()
	cli, err := r.srvs.client(0)
	require.NoError(t, err)
	defer cli.Close()
	w, err := newWorker("w", r.mcfg, cli, reader, r.tables, r.dense)
	require.NoError(t, err)

	b, err := reader.Next(ctx)
	require.NoError(t, err)
	stepErr := make(chan error, 1)
	go func() {
		applied, err := w.step(ctx, b, r, &r.gate, r.ledger)
		assert.True(t, applied)
		stepErr <- err
	}()
	<-svc.reporting // the batch's pushes are applied, its report is on its way: the worker is inside the gate
	checkpointed := make(chan struct{})
	go func() {
		r.checkpoint(ctx, false)
		close(checkpointed)
	}()
	close(svc.release)
	require.ErrorIs(t, <-stepErr, ErrPartialApply)
	<-checkpointed
	require.ErrorIs(t, r.gate.broken(), ErrPartialApply)

	r.checkpoint(ctx, true)
	r.ckpts.finish()
	st := r.ckpts.Stats()
	assert.Zero(t, st.Taken, "no snapshot of a model holding an uncounted batch")
	assert.Zero(t, st.Committed)
	assert.Equal(t, newLedger().encode(), r.ledger.encode(), "the failed batch is not in the ledger")
}
