package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// hotPSResult is the live hot-server scenario's outcome.
type hotPSResult struct {
	took  time.Duration // the AddServer decision to the slots moved (Applied.Took)
	moves int
	hot   int // hot slots left on the hot server, of hotSlots
}

const hotSlots = 8

// runHotPS runs the live hot-server scenario on an in-process job through the public API: two
// servers, workers whose records touch only ids of hotSlots slots that ps-0 owns, so ps-0
// serves every row and ps-1 none. An autoscale.Runner, whose clock moves 10 s a tick, sees
// ps-0 hot (its CPU share over a server of ServerCPU cores) for HotFor and adds a third server
// and moves the hottest slots by measured load. It returns the decision's Applied.Took: from
// the AddServer decision's start to the last slot moved.
func runHotPS(ctx context.Context, slots int) (hotPSResult, error) {
	const dim = 16
	shm, err := os.MkdirTemp("", "elasticps-bench-hotps-")
	if err != nil {
		return hotPSResult{}, err
	}
	defer os.RemoveAll(shm)
	var ids []uint64
	table := ps.TableSpec{Name: "emb", Config: embedding.Config{Dim: dim, Seed: 1,
		Init: embedding.Init{Kind: embedding.InitZeros}, Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.01}}}
	const records = 1 << 22
	data := shard.IndexedSource{Data: shard.IndexedFunc(records, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, ids[i%int64(len(ids))])
		rec.EndField()
		rec.Label = float32(i % 2)
		return nil
	})}
	job, err := local.Start(ctx, local.Config{
		Job: "bench-hotps", Servers: 2, Slots: slots, Tables: []ps.TableSpec{table},
		Coordinator: elastic.Config{Storage: checkpoint.NewMemStorage(), Logger: slog.New(slog.DiscardHandler),
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(records), ShardSize: 1024, Seed: 3}},
		Checkpoint: checkpoint.Config{ShmDir: shm},
	})
	if err != nil {
		return hotPSResult{}, err
	}
	defer job.Close()
	c := job.Coordinator()
	owners, err := c.OwnerTable(ctx, 0)
	if err != nil {
		return hotPSResult{}, err
	}
	hot := map[int]bool{}
	for id := uint64(1); len(ids) < 4000; id++ {
		sl := embedding.Slot(id, slots)
		if owners.Owner(sl).ID != "ps-0" || (!hot[sl] && len(hot) == hotSlots) {
			continue
		}
		hot[sl] = true
		ids = append(ids, id)
	}
	trained := make(chan struct{}, 1)
	scaler, err := local.NewScaler(local.ScalerConfig{
		Job:    job,
		Reader: func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: data, BatchSize: 256} },
		Worker: func(string) (local.StepFunc, error) {
			return func(ctx context.Context, b *elastic.Batch) error {
				g := make([]float32, dim*len(b.IDs))
				for i := range g {
					g[i] = 1e-3
				}
				if err := b.Push(ctx, "emb", b.IDs, g); err != nil {
					return err
				}
				select {
				case trained <- struct{}{}:
				default:
				}
				return nil
			}, nil
		},
	})
	if err != nil {
		return hotPSResult{}, err
	}
	defer scaler.Close()
	job.SetScaler(scaler)
	if err := c.SetParallelism(ctx, 2, 2); err != nil {
		return hotPSResult{}, err
	}
	p, err := autoscale.NewPlanner(autoscale.Config{MaxServers: 3, HotFor: 20 * time.Second, Settle: 1 << 20})
	if err != nil {
		return hotPSResult{}, err
	}
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	// A server of a hundredth of a core: ps-0's serving makes it hot whatever the machine.
	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: c, Planner: p, Now: func() time.Time { return now },
		ServerCPU: 0.01, RebalanceWindow: 300 * time.Millisecond})
	if err != nil {
		return hotPSResult{}, err
	}
	for tick := 0; tick < 10; tick++ {
		for range 20 {
			select {
			case <-trained:
			case <-ctx.Done():
				return hotPSResult{}, ctx.Err()
			}
		}
		applied, err := r.Tick(ctx)
		if err != nil {
			return hotPSResult{}, err
		}
		for _, a := range applied {
			if a.Err != nil {
				return hotPSResult{}, fmt.Errorf("%v: %w", a.Decision, a.Err)
			}
			if a.Decision.Kind != autoscale.AddServer {
				continue
			}
			after, err := c.OwnerTable(ctx, 0)
			if err != nil {
				return hotPSResult{}, err
			}
			res := hotPSResult{took: a.Took, moves: a.Moves}
			for sl := range hot {
				if after.Owner(sl).ID == "ps-0" {
					res.hot++
				}
			}
			if a.Moves == 0 || res.hot == hotSlots {
				return res, fmt.Errorf("the rebalance moved no hot slot off ps-0 (%d moves)", a.Moves)
			}
			return res, nil
		}
		now = now.Add(10 * time.Second)
	}
	return hotPSResult{}, fmt.Errorf("no server added in 10 ticks of a hot ps-0")
}
