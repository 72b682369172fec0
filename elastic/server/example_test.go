package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
)

// A parameter server trains a few rows and takes a checkpoint at step 1, which a coordinator
// commits; its replacement, a new process on another host (another shared-memory directory),
// loads its slots from the commit in storage.
func Example() {
	ctx := context.Background()
	shm, err := os.MkdirTemp("", "server-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(shm)
	store := checkpoint.NewMemStorage()
	spec := ps.TableSpec{Name: "emb", Config: embedding.Config{Dim: 2, Seed: 1,
		Init:      embedding.Init{Kind: embedding.InitZeros},
		Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 1}}}
	start := func(host string) (*ps.Server, *server.Server) {
		srv, err := ps.NewServer(ps.ServerConfig{ID: "ps-0", Secret: []byte("the cluster secret of the example"), Slots: 8, Tables: []ps.TableSpec{spec}})
		if err != nil {
			panic(err)
		}
		s, err := server.New(srv, "127.0.0.1:7000", checkpoint.Config{Job: "example", Storage: store, ShmDir: filepath.Join(shm, host)})
		if err != nil {
			panic(err)
		}
		return srv, s
	}

	srv, s := start("host-a")
	owners, err := ps.NewOwnerTable(1, 8, []ps.Node{s.Node()}, nil)
	if err != nil {
		panic(err)
	}
	if err := s.InstallTable(ctx, owners); err != nil {
		panic(err)
	}
	emb, _ := srv.Table("emb")
	// A gradient of (i, -i) for row i, at learning rate 1 from zeros: row i holds (-i, i).
	if err := emb.Apply([]uint64{1, 2, 3}, []float32{1, -1, 2, -2, 3, -3}, 1); err != nil {
		panic(err)
	}
	info, err := s.Snapshot(ctx, 1, elastic.Progress{}, elastic.Progress{})
	if err != nil {
		panic(err)
	}
	ref, err := s.WaitPersisted(ctx, 1)
	if err != nil {
		panic(err)
	}
	fmt.Printf("step %d: full snapshot %v, persisted by %s\n", info.Step, info.Full, ref.Node)
	committer, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "example", Storage: store})
	if err != nil {
		panic(err)
	}
	if _, err := committer.Commit(ctx, 1, []checkpoint.ManifestRef{ref}); err != nil {
		panic(err)
	}
	s.Close()
	srv.Close()

	srv, s = start("host-b")
	defer srv.Close()
	defer s.Close()
	if err := s.Load(ctx, 1, owners); err != nil {
		panic(err)
	}
	r := s.Restored()
	fmt.Printf("loaded step %d from %s: %d rows\n", r.Step, r.Sources["ps-0"], r.Records["emb"])
	emb, _ = srv.Table("emb")
	rows := make([]float32, 6)
	if err := emb.Peek([]uint64{1, 2, 3}, rows); err != nil {
		panic(err)
	}
	fmt.Println(rows)
	h, err := s.Health(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("health: snapshot %d, owner table version %d (the coordinator installs one next)\n", h.Snapshot, h.TableVersion)
	// Output:
	// step 1: full snapshot true, persisted by ps-0
	// loaded step 1 from storage: 3 rows
	// [-1 1 -2 2 -3 3]
	// health: snapshot 1, owner table version 0 (the coordinator installs one next)
}
