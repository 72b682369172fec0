package train

import (
	"context"
	"fmt"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/ps"
	"golang.org/x/sync/errgroup"
)

// Eval is one evaluation of the held-out set: every held-out record, scored with the parameters
// the servers hold (the MLP as of the evaluation's start, rows as each chunk is pulled).
type Eval struct {
	// Set names the records scored: "test" (the held-out test set) or "validation" (the
	// validation set carved from the training data, Config.ValidFraction).
	Set          string
	AUC, LogLoss float64
	Samples      int           // held-out records scored
	Trained      int64         // training samples the model had seen when the evaluation began
	Duration     time.Duration // time the evaluation took
}

// evalChunk is the number of held-out records scored per pull.
const evalChunk = 2048

// evaluator scores the held-out set against the parameter servers.
type evaluator struct {
	cli    *ps.Client
	m      *model.Model
	bb     *model.BatchBuilder
	rt     router
	brt    router
	tables sparseTables
	dense  []denseTensor
	test   []model.Sample
	set    string // Eval.Set
	labels []float32
	logits []float32
}

func newEvaluator(mcfg model.Config, cli *ps.Client, tables sparseTables, dense []denseTensor, test []model.Sample, set string) (*evaluator, error) {
	m, err := model.New(mcfg)
	if err != nil {
		return nil, err
	}
	bb, err := model.NewBatchBuilder(mcfg)
	if err != nil {
		return nil, err
	}
	return &evaluator{cli: cli, m: m, bb: bb, rt: newRouter(len(tables.emb), mcfg.EmbeddingDim), brt: newRouter(len(tables.bias), 1), tables: tables, dense: dense, test: test, set: set}, nil
}

// run scores every held-out record and returns AUC and log loss. Pulling rows of ids the
// training data never held creates them on the servers with their initial values (the servers
// have no read-only pull), which does not change any prediction.
func (e *evaluator) run(ctx context.Context) (Eval, error) {
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fanOut)
	pullDense(gctx, g, e.cli.PullDense, e.dense, e.m.Params())
	if err := g.Wait(); err != nil {
		return Eval{}, fmt.Errorf("evaluate: %w", err)
	}
	e.labels, e.logits = e.labels[:0], e.logits[:0]
	for off := 0; off < len(e.test); off += evalChunk {
		e.bb.Reset()
		for i := off; i < min(off+evalChunk, len(e.test)); i++ {
			if err := e.bb.Add(&e.test[i]); err != nil {
				return Eval{}, fmt.Errorf("evaluate: held-out record %d: %w", i, err)
			}
			e.labels = append(e.labels, e.test[i].Label)
		}
		e.rt.split(e.bb.Keys())
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(fanOut)
		readOnly := func(ctx context.Context, table string, ids []uint64, dst []float32) error {
			return e.cli.Pull(ctx, table, ids, dst, ps.ReadOnly()) // evaluation grows no rows
		}
		e.rt.pull(gctx, g, readOnly, e.tables.emb, e.bb.Rows())
		if e.tables.bias != nil {
			e.brt.split(e.bb.Keys())
			e.brt.pull(gctx, g, readOnly, e.tables.bias, e.bb.Biases())
		}
		if err := g.Wait(); err != nil {
			return Eval{}, fmt.Errorf("evaluate: %w", err)
		}
		var err error
		if e.logits, err = e.m.Logits(e.logits, e.bb.Batch()); err != nil {
			return Eval{}, fmt.Errorf("evaluate: %w", err)
		}
	}
	auc, err := model.AUC(e.labels, e.logits)
	if err != nil {
		return Eval{}, fmt.Errorf("evaluate: %w", err)
	}
	ll, err := model.LogLossLogits(e.labels, e.logits)
	if err != nil {
		return Eval{}, fmt.Errorf("evaluate: %w", err)
	}
	return Eval{Set: e.set, AUC: auc, LogLoss: ll, Samples: len(e.test), Duration: time.Since(start)}, nil
}
