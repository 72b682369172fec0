package elasticps_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// The whole flow on loopback TCP: two parameter servers, a data-shard dispatcher, a worker that
// pulls rows, pushes gradients and reports progress, a flash checkpoint committed with the
// dispatcher's position, and a restore of the rows onto a single new server.
func Example() {
	ctx := context.Background()
	secret := []byte("a 32-byte cluster secret........")
	spec := ps.TableSpec{Name: "item", Config: embedding.Config{Dim: 4, Seed: 7,
		Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.1}}}

	// Two parameter servers, each owning the slots an owner table gives it.
	start := func(id string) (*ps.Server, ps.Node, func()) {
		srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: secret, Tables: []ps.TableSpec{spec}})
		if err != nil {
			panic(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() { srv.Serve(l) })
		return srv, ps.Node{ID: id, Addr: l.Addr().String()}, func() { srv.Close(); wg.Wait() }
	}
	a, na, stopA := start("ps-a")
	defer stopA()
	b, nb, stopB := start("ps-b")
	defer stopB()
	owners, _ := ps.NewOwnerTable(1, ps.DefaultSlots, []ps.Node{na, nb}, nil)
	a.SetOwnerTable(owners)
	b.SetOwnerTable(owners)

	// The dispatcher leases shards of 400 records; record i is one categorical id.
	d, _ := shard.New(shard.Config{Dataset: shard.IndexedDataset(400), ShardSize: 50, Seed: 1})
	data := shard.IndexedFunc(400, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i % 2)
		rec.IDs = append(rec.IDs, uint64(i%60))
		rec.EndField()
		return nil
	})

	// A worker: pull the batch's rows, push a gradient, report the batch trained.
	cli, _ := ps.NewClient(ps.ClientConfig{Secret: secret, Servers: []string{na.Addr, nb.Addr}})
	defer cli.Close()
	rd, _ := shard.NewReader(shard.ReaderConfig{Service: d, Worker: "worker-0", Source: shard.IndexedSource{Data: data}, BatchSize: 25})
	defer rd.Close()
	step, trained := uint64(0), 0
	for {
		batch, err := rd.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			panic(err)
		}
		ids := batch.IDs
		rows := make([]float32, 4*len(ids))
		if err := cli.Pull(ctx, "item", ids, rows); err != nil {
			panic(err)
		}
		grads := make([]float32, len(rows))
		for i := range grads {
			grads[i] = batch.Labels[i/4] - 0.5 // stands in for a model's backward pass
		}
		step++
		if err := cli.Push(ctx, "item", ids, grads, step); err != nil {
			panic(err)
		}
		trained += batch.Len()
		rd.Done(ctx, batch)
	}
	ta, _ := a.Table("item")
	tb, _ := b.Table("item")
	fmt.Printf("trained %d records in %d steps; rows: %d on ps-a + %d on ps-b\n", trained, step, ta.Len(), tb.Len())

	// A flash checkpoint: every server copies its rows, the coordinator commits them together
	// with the dispatcher's position.
	shm, _ := os.MkdirTemp("", "elasticps-example-shm")
	defer os.RemoveAll(shm)
	store := checkpoint.NewMemStorage()
	var refs []checkpoint.ManifestRef
	for _, s := range []*ps.Server{a, b} {
		t, _ := s.Table("item")
		ck, err := checkpoint.New(checkpoint.Config{Job: "demo", Node: s.ID(), Storage: store, ShmDir: shm,
			Tables: map[string]checkpoint.Table{"item": t}})
		if err != nil {
			panic(err)
		}
		if _, err := ck.Snapshot(ctx, step, checkpoint.SnapshotSlots(owners.SlotsOf(s.ID()).Members())); err != nil {
			panic(err)
		}
		ref, err := ck.WaitPersisted(ctx, step)
		if err != nil {
			panic(err)
		}
		refs = append(refs, ref)
		ck.Close()
	}
	committer, _ := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "demo", Storage: store})
	if _, err := committer.Commit(ctx, step, refs, checkpoint.Blob{Name: "dispatcher", Data: d.Snapshot()}); err != nil {
		panic(err)
	}

	// Restore onto one new server, which now owns every slot.
	one, _ := embedding.New(spec.Config)
	ck, _ := checkpoint.New(checkpoint.Config{Job: "demo", Node: "ps-new", Storage: store, ShmDir: shm,
		Tables: map[string]checkpoint.Table{"item": one}})
	defer ck.Close()
	res, err := ck.Restore(ctx)
	if err != nil {
		panic(err)
	}
	r1, _ := one.Row(1)
	r1a, _ := ta.Row(1)
	if r1b, ok := tb.Row(1); ok {
		r1a = r1b
	}
	fmt.Printf("restored step %d onto one server: %d rows, bit-exact: %v\n", res.Step, one.Len(), fmt.Sprint(r1.Weights) == fmt.Sprint(r1a.Weights))
	// Output:
	// trained 400 records in 16 steps; rows: 36 on ps-a + 24 on ps-b
	// restored step 16 onto one server: 60 rows, bit-exact: true
}
