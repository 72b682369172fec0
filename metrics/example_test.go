package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/metrics"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// A worker's metrics, on a registry of the program's own, served on /metrics and scraped as
// Prometheus would.
func Example() {
	reg := prometheus.NewRegistry()
	w, err := metrics.NewWorker(metrics.Config{Job: "ctr", Node: "worker-0"})
	if err != nil {
		panic(err)
	}
	reg.MustRegister(w)
	for _, loss := range []float64{0.9, 0.6, 0.45} {
		w.ObserveStep(metrics.Step{Pull: 2 * time.Millisecond, Compute: 5 * time.Millisecond, Push: 3 * time.Millisecond, Samples: 256, Loss: loss})
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- metrics.Serve(ctx, ln, reg, nil) }()
	resp, err := http.Get("http://" + ln.Addr().String() + metrics.Path)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "elasticps_worker_samples_total") || strings.HasPrefix(line, "elasticps_worker_loss") ||
			strings.HasPrefix(line, "elasticps_worker_step_duration_seconds_count") {
			fmt.Println(line)
		}
	}
	stop()
	fmt.Println("served until the context ended:", <-served)
	// Output:
	// elasticps_worker_loss{node="worker-0",role="worker",training_job="ctr"} 0.45
	// elasticps_worker_samples_total{node="worker-0",role="worker",training_job="ctr"} 768
	// elasticps_worker_step_duration_seconds_count{node="worker-0",phase="compute",role="worker",training_job="ctr"} 3
	// elasticps_worker_step_duration_seconds_count{node="worker-0",phase="pull",role="worker",training_job="ctr"} 3
	// elasticps_worker_step_duration_seconds_count{node="worker-0",phase="push",role="worker",training_job="ctr"} 3
	// served until the context ended: <nil>
}

// The coordinator's metrics: Hook takes the checkpoint and recovery events from the
// coordinator's Config, SetSource names the coordinator whose Status each scrape reads.
func ExampleCoordinator() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "metrics-example")
	defer os.RemoveAll(dir)
	store, _ := checkpoint.NewFSStorage(filepath.Join(dir, "checkpoints"))

	cm, err := metrics.NewCoordinator(metrics.Config{Job: "ctr"})
	if err != nil {
		panic(err)
	}
	cfg := elastic.Config{Storage: store, Dispatcher: shard.Config{Dataset: shard.IndexedDataset(256), ShardSize: 64}}
	cm.Hook(&cfg)
	job, err := local.Start(ctx, local.Config{Job: "ctr", Servers: 1, Slots: 16,
		Tables:      []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 4}}},
		Coordinator: cfg, Checkpoint: checkpoint.Config{ShmDir: filepath.Join(dir, "shm")}})
	if err != nil {
		panic(err)
	}
	defer job.Close()
	cm.SetSource(job.Coordinator())
	reg := prometheus.NewRegistry()
	reg.MustRegister(cm)

	s, err := job.NewSession("worker-0", shard.ReaderConfig{BatchSize: 32, Source: shard.IndexedSource{Data: shard.IndexedFunc(256, func(i int64, rec *shard.Record) error {
		rec.IDs = append(rec.IDs, uint64(i))
		rec.EndField()
		return nil
	})}})
	if err != nil {
		panic(err)
	}
	for {
		err := s.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
			return b.Push(ctx, "emb", b.IDs, make([]float32, 4*len(b.IDs)))
		})
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			panic(err)
		}
	}
	s.Close()
	if _, err := job.Coordinator().Checkpoint(ctx); err != nil {
		panic(err)
	}

	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "elasticps_coordinator_step", "elasticps_coordinator_checkpoints_total", "elasticps_coordinator_exactly_once_violations":
			for _, m := range mf.GetMetric() {
				stage := ""
				for _, l := range m.GetLabel() {
					if l.GetName() == "stage" {
						stage = " " + l.GetValue()
					}
				}
				fmt.Printf("%s%s: %v\n", mf.GetName(), stage, m.GetCounter().GetValue()+m.GetGauge().GetValue())
			}
		}
	}
	// Output:
	// elasticps_coordinator_checkpoints_total commit: 1
	// elasticps_coordinator_checkpoints_total snapshot: 1
	// elasticps_coordinator_exactly_once_violations: 0
	// elasticps_coordinator_step: 8
}
