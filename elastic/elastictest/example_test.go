package elastictest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// A job in memory grows from two parameter servers to three while a worker trains. The first
// try fails, because the new server loses the owner table it is given (a FaultServer's rule),
// and the recorder shows the coordinator stopping the server it could not enlist; the second
// try moves the slots.
func Example() {
	ctx := context.Background()
	clock := elastictest.NewClock(time.Unix(1_700_000_000, 0))
	errLost := errors.New("owner table lost on its way")
	lose := true // the first ps-2 loses its owner table
	job, err := elastictest.Start(ctx, elastictest.Config{
		Servers: 2,
		Tables:  []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 4}}},
		Coordinator: elastic.Config{Now: clock.Now,
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(1024), ShardSize: 256}},
		WrapServer: func(s elastic.ParameterServer) elastic.ParameterServer {
			f := elastictest.NewFaultServer(s)
			if s.Node().ID == "ps-2" && lose {
				lose = false
				f.Inject(elastictest.Rule{Method: elastictest.MethodInstallTable, Err: errLost})
			}
			return f
		},
	})
	if err != nil {
		panic(err)
	}
	defer job.Close()
	scaler := elastictest.NewRecorder(elastictest.RecorderConfig{Servers: 2, Pool: job})
	job.Coordinator().SetScaler(scaler)

	data := shard.IndexedSource{Data: shard.IndexedFunc(1024, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, uint64(i%100))
		rec.EndField()
		return nil
	})}
	sess, err := job.Session("worker-0", shard.ReaderConfig{Source: data, BatchSize: 32})
	if err != nil {
		panic(err)
	}
	step := func(ctx context.Context, b *elastic.Batch) error {
		return b.Push(ctx, "emb", b.IDs, make([]float32, 4*len(b.IDs)))
	}
	for range 4 {
		if err := sess.Step(ctx, step); err != nil {
			panic(err)
		}
	}

	err = job.Coordinator().SetParallelism(ctx, 1, 3)
	fmt.Println("first try lost the table:", errors.Is(err, errLost))
	err = job.Coordinator().SetParallelism(ctx, 1, 3)
	fmt.Println("second try:", err)
	for _, c := range scaler.Calls() {
		fmt.Println(c)
	}
	for range 4 {
		if err := sess.Step(ctx, step); err != nil {
			panic(err)
		}
	}
	fmt.Println("servers:", len(job.Coordinator().Status().Servers), "steps:", job.Coordinator().Status().Step)
	// Output:
	// first try lost the table: true
	// second try: <nil>
	// StartServers(1)
	// StopServers([ps-2])
	// StartServers(1)
	// Scale(3 servers, 1 workers)
	// servers: 3 steps: 8
}
