package train

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/internal/ctl"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// workerCounters are one worker process's figures.
type workerCounters struct {
	steps, samples atomic.Int64
}

func (c *workerCounters) nextStep() uint32 { return uint32(c.steps.Add(1)) }
func (c *workerCounters) trained(n int, _ float64) {
	c.samples.Add(int64(n))
}

// RunWorker runs one worker until the data is done, the coordinator says stop, or ctx ends. It
// pulls from and pushes to the parameter servers of rc.PS, leases data shards from the
// coordinator's dispatcher at rc.Dispatcher, and pauses at the coordinator's checkpoint
// barriers; it applies no batch before it has registered with the coordinator, nor while it
// cannot reach it. It returns the samples it trained, and an error wrapping ErrPartialApply if
// a batch failed while being applied (the coordinator is told, and stops the job).
func RunWorker(ctx context.Context, rc RoleConfig) (int64, error) {
	if err := rc.prepare(); err != nil {
		return 0, err
	}
	if rc.ID == "" || rc.Dispatcher == "" {
		return 0, fmt.Errorf("%w: a worker needs an ID and the dispatcher's address", ErrConfig)
	}
	cfg := &rc.Config
	data, err := loadData(ctx, cfg)
	if err != nil {
		return 0, err
	}
	mcfg := model.Config{DenseFeatures: data.dense, Fields: len(data.fields), EmbeddingDim: cfg.EmbeddingDim,
		BottomHidden: cfg.BottomHidden, TopHidden: cfg.TopHidden, FieldPooling: data.pooling, Seed: cfg.Seed}
	m0, err := model.New(mcfg)
	if err != nil {
		return 0, err
	}
	mcfg = m0.Config()
	dense := denseTensors(m0)
	var tables []string
	for _, f := range data.fields {
		tables = append(tables, embPrefix+f)
	}
	table, err := ps.NewOwnerTable(1, cfg.Slots, rc.PS, nil)
	if err != nil {
		return 0, err
	}
	holder := &ps.TableHolder{}
	holder.Set(table)
	cli, err := ps.NewClient(ps.ClientConfig{Secret: rc.Secret, Resolver: holder, Logger: rc.Logger})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	if err := initDense(ctx, cli, dense, m0.Params(), cfg.DenseOptimizer); err != nil {
		return 0, err
	}
	svc, err := shardnet.NewClient(shardnet.ClientConfig{Addr: rc.Dispatcher, Secret: rc.Secret, Logger: rc.Logger})
	if err != nil {
		return 0, err
	}
	defer svc.Close()
	reader, err := shard.NewReader(shard.ReaderConfig{Service: svc, Worker: rc.ID, Source: data.source,
		BatchSize: cfg.BatchSize, ReportEvery: 1, Seed: cfg.Seed, Logger: rc.Logger})
	if err != nil {
		return 0, err
	}
	defer reader.Close()
	w, err := newWorker(rc.ID, mcfg, cli, reader, tables, dense)
	if err != nil {
		return 0, err
	}
	caddr, err := ControlAddr(rc.Dispatcher)
	if err != nil {
		return 0, err
	}
	coord := ctl.NewClient(caddr, rc.Secret)
	defer coord.Close()

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var g gate
	var c workerCounters
	// The gate starts closed: no batch is applied before the coordinator knows this worker, so
	// no checkpoint barrier can miss it.
	g.close()
	var bwg sync.WaitGroup
	bwg.Add(1)
	go func() {
		defer bwg.Done()
		followBarrier(wctx, coord, rc.ID, &g, stop, rc.Logger)
	}()
	err = w.run(wctx, &c, &g, newLedger())
	stop()
	bwg.Wait()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if broken := g.broken(); broken != nil {
		// Tell the coordinator, which then takes no checkpoint, rather than leave: a worker that
		// left would not hold up the next barrier, and its checkpoint would hold part of a batch.
		if ferr := coord.Call(lctx, "Coord.Failed", ctl.Failure{Worker: rc.ID, Err: broken.Error()}, &ctl.Empty{}); ferr != nil {
			rc.Logger.Warn("cannot tell the coordinator that a batch failed", "err", ferr)
		}
	} else {
		coord.Call(lctx, "Coord.Leave", ctl.Barrier{Worker: rc.ID}, &ctl.Empty{})
	}
	return c.samples.Load(), err
}

// followBarrier keeps the worker registered with the coordinator and its gate in step with the
// coordinator's checkpoint barriers. The caller closed the gate; it stays closed until the
// worker has registered (Coord.Join). At a barrier the follower closes the gate (waiting for
// the batch being applied), says it arrived and reopens the gate when released. When a poll
// fails or outlasts pollTimeout, or the coordinator does not count the worker any more, it
// closes the gate and registers again before it reopens it, so a worker that lost touch with
// the coordinator applies nothing a checkpoint could miss. While it waits for a batch being
// applied to finish before arriving, it keeps polling, so that the coordinator does not take it
// for dead. A worker whose gate broke (a batch
// failed while being applied) tells the coordinator instead of arriving. It opens the gate when
// it returns, so that the training loop can see its context ended.
func followBarrier(ctx context.Context, coord *ctl.Client, id string, g *gate, stop func(), logger *slog.Logger) {
	closed := true
	defer func() {
		if closed {
			g.open()
		}
	}()
	call := func(method string, timeout time.Duration, args, reply any) error {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return coord.Call(cctx, method, args, reply)
	}
	retry := func(err error) {
		if ctx.Err() != nil {
			return
		}
		logger.Debug("coordinator unreachable", "err", err)
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	for ctx.Err() == nil {
		var rep ctl.BarrierReply
		if err := call("Coord.Join", pollTimeout, ctl.Barrier{Worker: id}, &rep); err != nil {
			retry(err)
			continue
		}
	follow:
		for {
			switch {
			case rep.Stop:
				stop()
				return
			case rep.Rejoin:
				break follow
			case rep.Pause:
				if !closed {
					closeGate(g, func() {
						// Still alive, closing the gate: a batch being applied may take a
						// while, and the coordinator drops workers it does not hear from.
						var hb ctl.BarrierReply
						_ = call("Coord.Wait", pollTimeout, ctl.Barrier{Worker: id, Gen: rep.Gen}, &hb)
					})
					closed = true
				}
				if err := g.broken(); err != nil {
					// The coordinator learns of it from RunWorker (Coord.Failed); arriving would
					// let it checkpoint the broken batch.
					stop()
					return
				}
				gen := rep.Gen
				rep = ctl.BarrierReply{}
				if err := call("Coord.Arrived", arriveTimeout, ctl.Barrier{Worker: id, Gen: gen}, &rep); err != nil {
					retry(err)
					break follow
				}
				continue
			}
			if closed {
				g.open()
				closed = false
			}
			gen := rep.Gen
			rep = ctl.BarrierReply{}
			if err := call("Coord.Wait", pollTimeout, ctl.Barrier{Worker: id, Gen: gen}, &rep); err != nil {
				// Lost touch: apply nothing until registered again.
				g.close()
				closed = true
				retry(err)
				break follow
			}
		}
	}
}

// closeGate closes g, calling heartbeat every pollWait/2 while it waits for the batch being
// applied to finish.
func closeGate(g *gate, heartbeat func()) {
	closed := make(chan struct{})
	go func() {
		g.close()
		close(closed)
	}()
	tick := time.NewTicker(pollWait / 2)
	defer tick.Stop()
	for {
		select {
		case <-closed:
			return
		case <-tick.C:
			heartbeat()
		}
	}
}
