package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"golang.org/x/sync/errgroup"
)

// applyTimeout bounds how long a worker may take to apply a batch it started applying (pushes
// and the progress report) after the run was told to stop.
const applyTimeout = time.Minute

// fanOut bounds the calls one worker step has in flight at once.
const fanOut = 16

// worker trains: it reads batches from its shard reader, pulls the rows and the MLP from the
// parameter servers, computes gradients and pushes them back.
type worker struct {
	name   string
	cli    *ps.Client
	svc    io.Closer // the dispatcher client
	reader *shard.Reader
	m      *model.Model
	bb     *model.BatchBuilder
	g      model.Gradients
	s      model.Sample
	rt     router
	tables []string
	dense  []denseTensor
}

// counters are the training figures every worker adds to.
type counters interface {
	nextStep() uint32
	trained(samples int, loss float64)
}

func newWorker(name string, mcfg model.Config, cli *ps.Client, reader *shard.Reader, tables []string, dense []denseTensor) (*worker, error) {
	m, err := model.New(mcfg)
	if err != nil {
		return nil, err
	}
	bb, err := model.NewBatchBuilder(mcfg)
	if err != nil {
		return nil, err
	}
	return &worker{name: name, cli: cli, reader: reader, m: m, bb: bb, tables: tables, dense: dense,
		rt: newRouter(len(tables), mcfg.EmbeddingDim)}, nil
}

// run trains until the data is exhausted (nil), ctx ends (nil), or a step fails.
func (w *worker) run(ctx context.Context, c counters, g *gate, l *ledger) error {
	for {
		b, err := w.reader.Next(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("worker %s: read: %w", w.name, err)
		}
		applied, err := w.step(ctx, b, c, g, l)
		if err != nil {
			if !applied && ctx.Err() != nil {
				return nil // stopped before applying anything: the batch is trained after a resume
			}
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

// step trains one batch. Reading the parameters and computing gradients happen outside the
// gate; applying them (every push) and reporting the batch happen inside it, so a checkpoint
// never sees a batch half applied or applied but not reported. A batch without records (the
// rest of its shard was held-out or malformed lines) is a step that only reports its range.
// A push or report that fails breaks the gate (ErrPartialApply): the model may then hold part of
// a batch the dispatcher did not count, so no checkpoint may be taken after it.
// It reports whether it began applying the batch.
func (w *worker) step(ctx context.Context, b *shard.Batch, c counters, gt *gate, l *ledger) (bool, error) {
	n, epoch := b.Len(), b.Epoch
	from, to := b.Shard.Base+b.Start, b.Shard.Base+b.End
	if n > 0 {
		if err := w.fill(b); err != nil {
			return false, err
		}
		w.rt.split(w.bb.Keys())
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(fanOut)
		w.rt.pull(gctx, g, w.cli, w.tables, w.bb.Rows())
		pullDense(gctx, g, w.cli, w.dense, w.m.Params())
		if err := g.Wait(); err != nil {
			return false, fmt.Errorf("pull: %w", err)
		}
		if err := w.m.ComputeGradients(w.bb.Batch(), &w.g); err != nil {
			return false, fmt.Errorf("gradients: %w", err)
		}
	}

	gt.enter()
	defer gt.exit()
	if err := ctx.Err(); err != nil {
		// Stopped while waiting at the gate (a checkpoint): apply nothing. The batch's lease
		// ends unreported, so its records are trained after a resume.
		return false, err
	}
	// A started apply is finished even if the run is stopping: the checkpoint that follows must
	// find every batch either wholly applied and reported, or not applied at all.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), applyTimeout)
	defer cancel()
	step := c.nextStep()
	if n > 0 {
		pg, pctx := errgroup.WithContext(actx)
		pg.SetLimit(fanOut)
		w.rt.push(pctx, pg, w.cli, w.tables, w.g.Rows, step)
		pushDense(pctx, pg, w.cli, w.dense, w.g.Dense, step)
		if err := pg.Wait(); err != nil {
			err = fmt.Errorf("%w: push: %w", ErrPartialApply, err)
			gt.fail(err)
			return true, err
		}
	}
	if err := w.reader.Done(actx, b); err != nil {
		// The report may still land (its answer was lost): either way the dispatcher's count and
		// the model may disagree from here on.
		err = fmt.Errorf("%w: report: %w", ErrPartialApply, err)
		gt.fail(err)
		return true, err
	}
	l.mark(epoch, from, to)
	if n > 0 {
		c.trained(n, w.g.Loss)
	}
	return true, nil
}

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
func (r *router) pull(ctx context.Context, g *errgroup.Group, cli *ps.Client, tables []string, rows []float32, opts ...ps.PullOption) {
	d := r.dim
	for f := range tables {
		if len(r.ids[f]) == 0 {
			continue
		}
		g.Go(func() error {
			buf := r.buf[f]
			if err := cli.Pull(ctx, tables[f], r.ids[f], buf, opts...); err != nil {
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
func (r *router) push(ctx context.Context, g *errgroup.Group, cli *ps.Client, tables []string, grads []float32, step uint32) {
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
			if err := cli.Push(ctx, tables[f], r.ids[f], buf, step); err != nil {
				return fmt.Errorf("%s: %w", tables[f], err)
			}
			return nil
		})
	}
}
