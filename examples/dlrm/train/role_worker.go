package train

import (
	"context"
	"errors"
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
// barriers. It returns the samples it trained.
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
	coord.Call(lctx, "Coord.Leave", ctl.Barrier{Worker: rc.ID}, &ctl.Empty{})
	return c.samples.Load(), err
}

// followBarrier long-polls the coordinator: at a barrier it closes the worker's gate (waiting
// for the batch being applied), says it arrived and reopens the gate when released.
func followBarrier(ctx context.Context, coord *ctl.Client, id string, g *gate, stop func(), logger *slog.Logger) {
	var gen uint64
	for ctx.Err() == nil {
		var rep ctl.BarrierReply
		if err := coord.Call(ctx, "Coord.Wait", ctl.Barrier{Worker: id, Gen: gen}, &rep); err != nil {
			if ctx.Err() == nil {
				logger.Debug("coordinator unreachable", "err", err)
				select {
				case <-time.After(500 * time.Millisecond):
				case <-ctx.Done():
				}
			}
			continue
		}
		gen = rep.Gen
		if rep.Stop {
			stop()
			return
		}
		if rep.Pause {
			g.close()
			var rel ctl.BarrierReply
			err := coord.Call(ctx, "Coord.Arrived", ctl.Barrier{Worker: id, Gen: gen}, &rel)
			g.open()
			if err != nil && !errors.Is(err, context.Canceled) {
				logger.Warn("checkpoint barrier failed", "err", err)
			}
			if rel.Stop {
				stop()
				return
			}
		}
	}
}
