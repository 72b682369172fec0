package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/shard"
	"golang.org/x/sync/errgroup"
)

// fanOut bounds the calls one worker step has in flight at once.
const fanOut = 16

// worker trains through its session: each step pulls the batch's rows and the MLP from the
// parameter servers, computes gradients and pushes them back.
type worker struct {
	name   string
	sess   *elastic.Session
	m      *model.Model
	bb     *model.BatchBuilder
	g      model.Gradients
	s      model.Sample
	rt     router // embedding rows
	brt    router // first-order scalars (Config.FirstOrder)
	tables sparseTables
	dense  []denseTensor
}

// counters are the training figures every worker adds to.
type counters interface {
	trained(worker string, st stepFigures)
}

// stepFigures are one trained batch's: its samples and loss, and the time its pulls, its
// gradients and its pushes took.
type stepFigures struct {
	samples             int
	loss                float64
	pull, compute, push time.Duration
}

func newWorker(name string, mcfg model.Config, sess *elastic.Session, tables sparseTables, dense []denseTensor) (*worker, error) {
	m, err := model.New(mcfg)
	if err != nil {
		return nil, err
	}
	bb, err := model.NewBatchBuilder(mcfg)
	if err != nil {
		return nil, err
	}
	return &worker{name: name, sess: sess, m: m, bb: bb, tables: tables, dense: dense,
		rt: newRouter(len(tables.emb), mcfg.EmbeddingDim), brt: newRouter(len(tables.bias), 1)}, nil
}

// run trains until the data is exhausted (nil), ctx ends (nil), or a step fails. A step begun
// before ctx ended is finished (the session does that), so a checkpoint after the run never
// finds a batch half applied.
func (w *worker) run(ctx context.Context, c counters) error {
	for {
		err := w.sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error { return w.step(ctx, b, c) })
		switch {
		case err == nil:
		case errors.Is(err, io.EOF), errors.Is(err, elastic.ErrStopped), ctx.Err() != nil && !errors.Is(err, elastic.ErrBatchFailed):
			return nil
		default:
			return fmt.Errorf("worker %s: %w", w.name, err)
		}
	}
}

// fill loads a shard batch into the batch builder.
func (w *worker) fill(b *shard.Batch) error {
	w.bb.Reset()
	nf := b.NumFields
	for i := range b.Len() {
		s := &w.s
		s.Label = b.Labels[i]
		if b.DenseDim == 0 {
			s.Dense = append(s.Dense[:0], 1)
		} else {
			s.Dense = b.Dense[i*b.DenseDim : (i+1)*b.DenseDim]
		}
		lo, hi := b.Offsets[i*nf], b.Offsets[(i+1)*nf]
		s.IDs = b.IDs[lo:hi]
		s.Values = nil
		if len(b.Values) != 0 {
			s.Values = b.Values[lo:hi] // libSVM and libFM values weigh their rows
		}
		s.Offsets = s.Offsets[:0]
		for f := 0; f <= nf; f++ {
			s.Offsets = append(s.Offsets, b.Offsets[i*nf+f]-lo)
		}
		if err := w.bb.Add(s); err != nil {
			return fmt.Errorf("record at shard %d offset %d: %w", b.Shard.Index, b.RecordOffsets[i], err)
		}
	}
	return nil
}

// step trains one batch inside the session's step: pull, gradients, push. A batch without
// records (the rest of its shard was held-out or malformed lines) pushes nothing; the session
// still reports its range. A step that fails is run again by the session: the servers apply
// each batch position at most once per slot, so a retry never adds an update twice.
func (w *worker) step(ctx context.Context, b *elastic.Batch, c counters) error {
	n := b.Len()
	if n == 0 {
		return nil
	}
	if err := w.fill(b.Batch); err != nil {
		return err
	}
	w.rt.split(w.bb.Keys())
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fanOut)
	pull := func(ctx context.Context, table string, ids []uint64, dst []float32) error {
		return b.Pull(ctx, table, ids, dst)
	}
	w.rt.pull(gctx, g, pull, w.tables.emb, w.bb.Rows())
	if w.tables.bias != nil {
		w.brt.split(w.bb.Keys())
		w.brt.pull(gctx, g, pull, w.tables.bias, w.bb.Biases())
	}
	pullDense(gctx, g, b.PullDense, w.dense, w.m.Params())
	if err := g.Wait(); err != nil {
		return fmt.Errorf("pull: %w", err)
	}
	pulled := time.Now()
	if err := w.m.ComputeGradients(w.bb.Batch(), &w.g); err != nil {
		return fmt.Errorf("gradients: %w", err)
	}
	computed := time.Now()
	pg, pctx := errgroup.WithContext(ctx)
	pg.SetLimit(fanOut)
	w.rt.push(pctx, pg, b.Push, w.tables.emb, w.g.Rows)
	if w.tables.bias != nil {
		w.brt.push(pctx, pg, b.Push, w.tables.bias, w.g.Biases)
	}
	pushDense(pctx, pg, b.PushDense, w.dense, w.g.Dense)
	if err := pg.Wait(); err != nil {
		return fmt.Errorf("push: %w", err)
	}
	c.trained(w.name, stepFigures{samples: n, loss: w.g.Loss, pull: pulled.Sub(start), compute: computed.Sub(pulled), push: time.Since(computed)})
	return nil
}

// pullFunc reads rows of a table; pushFunc applies gradients to them.
type (
	pullFunc func(ctx context.Context, table string, ids []uint64, dst []float32) error
	pushFunc func(ctx context.Context, table string, ids []uint64, grads []float32) error
)

// router splits the distinct keys of a batch by field (one embedding table each) and moves rows
// between the batch's layout and the per-table calls.
type router struct {
	dim int
	ids [][]uint64 // per field: ids in first-seen order
	pos [][]int32  // per field: the row of each id in the batch
	buf [][]float32
}

func newRouter(fields, dim int) router {
	return router{dim: dim, ids: make([][]uint64, fields), pos: make([][]int32, fields), buf: make([][]float32, fields)}
}

func (r *router) split(keys []model.Key) {
	for f := range r.ids {
		r.ids[f], r.pos[f] = r.ids[f][:0], r.pos[f][:0]
	}
	for i, k := range keys {
		r.ids[k.Field] = append(r.ids[k.Field], k.ID)
		r.pos[k.Field] = append(r.pos[k.Field], int32(i))
	}
	for f := range r.buf {
		if need := len(r.ids[f]) * r.dim; cap(r.buf[f]) < need {
			r.buf[f] = make([]float32, need)
		} else {
			r.buf[f] = r.buf[f][:need]
		}
	}
}

// pull fetches every field's rows and scatters them into rows (the batch's layout).
func (r *router) pull(ctx context.Context, g *errgroup.Group, pull pullFunc, tables []string, rows []float32) {
	d := r.dim
	for f := range tables {
		if len(r.ids[f]) == 0 {
			continue
		}
		g.Go(func() error {
			buf := r.buf[f]
			if err := pull(ctx, tables[f], r.ids[f], buf); err != nil {
				return fmt.Errorf("%s: %w", tables[f], err)
			}
			for j, p := range r.pos[f] {
				copy(rows[int(p)*d:int(p)*d+d], buf[j*d:j*d+d])
			}
			return nil
		})
	}
}

// push gathers every field's gradient rows from grads (the batch's layout) and pushes them.
func (r *router) push(ctx context.Context, g *errgroup.Group, push pushFunc, tables []string, grads []float32) {
	d := r.dim
	for f := range tables {
		if len(r.ids[f]) == 0 {
			continue
		}
		g.Go(func() error {
			buf := r.buf[f]
			for j, p := range r.pos[f] {
				copy(buf[j*d:j*d+d], grads[int(p)*d:int(p)*d+d])
			}
			if err := push(ctx, tables[f], r.ids[f], buf); err != nil {
				return fmt.Errorf("%s: %w", tables[f], err)
			}
			return nil
		})
	}
}
