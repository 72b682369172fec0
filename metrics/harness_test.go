package metrics_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/metrics"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// dim is the test model's embedding width.
const dim = 4

// jobOptions shape a test job.
type jobOptions struct {
	records   int64         // dataset size
	shardSize int64         // records per shard
	batch     int           // records per batch
	every     int           // steps between checkpoints, 0 none by steps
	pace      time.Duration // a worker's least time per step, 0 none
}

// testJob is an in-process job whose every role (the coordinator, each server, each worker)
// has its own registry served on its own loopback listener, as separate processes would.
type testJob struct {
	t      *testing.T
	job    *local.Job
	scaler *local.Scaler
	coord  *metrics.Coordinator
	ctx    context.Context

	mu       sync.Mutex
	nodes    map[string]*node // by node id: coordinator, ps-i, worker-i
	workers  map[string]*workerState
	events   []elastic.CheckpointEvent // every checkpoint event, in order
	changed  chan struct{}             // closed and replaced at each event and each node served
	serveErr chan error
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// node is one role's registry and its /metrics listener.
type node struct {
	role string
	reg  *prometheus.Registry
	addr string // host:port of its listener
}

// workerState is what the test knows of a worker's steps.
type workerState struct {
	m       *metrics.Worker
	steps   int
	samples int
	loss    float64
}

const jobName = "metrics-test"

// startJob starts a job of two servers with every role's metrics served, and no worker yet
// (setParallelism starts them).
func startJob(t *testing.T, o jobOptions) *testJob {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	tj := &testJob{t: t, ctx: ctx, stop: stop, nodes: map[string]*node{}, changed: make(chan struct{}), workers: map[string]*workerState{}, serveErr: make(chan error, 16)}
	dir := t.TempDir()
	store, err := checkpoint.NewFSStorage(filepath.Join(dir, "checkpoints"))
	require.NoError(t, err)

	tj.coord, err = metrics.NewCoordinator(metrics.Config{Job: jobName})
	require.NoError(t, err)
	cc := elastic.Config{Storage: store, CheckpointEvery: o.every,
		Dispatcher: shard.Config{Dataset: shard.IndexedDataset(o.records), ShardSize: o.shardSize},
		OnCheckpoint: func(e elastic.CheckpointEvent) {
			tj.mu.Lock()
			tj.events = append(tj.events, e)
			tj.changedLocked()
			tj.mu.Unlock()
		}}
	tj.coord.Hook(&cc)
	tj.job, err = local.Start(ctx, local.Config{Job: jobName, Servers: 2, Slots: 64,
		Tables: []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: dim, Seed: 3,
			Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.05}}}},
		Coordinator: cc,
		Checkpoint:  checkpoint.Config{ShmDir: filepath.Join(dir, "shm")}})
	require.NoError(t, err)
	tj.coord.SetSource(metrics.StatusFunc(func() elastic.Status { return tj.job.Coordinator().Status() }))
	_, err = tj.serve("coordinator", "coordinator", tj.coord)
	require.NoError(t, err)
	for _, s := range tj.job.Servers {
		tj.addServer(s.Server())
	}

	data := shard.IndexedSource{Data: shard.IndexedFunc(o.records, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i % 2)
		rec.IDs = append(rec.IDs, uint64(i%97))
		rec.EndField()
		return nil
	})}
	tj.scaler, err = local.NewScaler(local.ScalerConfig{Job: tj.job,
		Reader: func(string) shard.ReaderConfig { return shard.ReaderConfig{Source: data, BatchSize: o.batch} },
		Worker: func(id string) (local.StepFunc, error) { return tj.stepFunc(id, o.pace) }})
	require.NoError(t, err)
	tj.job.SetScaler(tj.scaler)
	t.Cleanup(tj.close)
	return tj
}

// serve gives node id its own registry, with c (if not nil) and the process's series, served
// on loopback. It may run on a worker's goroutine, so it returns its errors.
func (tj *testJob) serve(id, role string, c prometheus.Collector) (*node, error) {
	reg := prometheus.NewRegistry()
	if c != nil {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	if err := metrics.RegisterProcess(reg, metrics.Config{Job: jobName, Role: role, Node: id}); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	n := &node{role: role, reg: reg, addr: ln.Addr().String()}
	tj.mu.Lock()
	tj.nodes[id] = n
	tj.changedLocked()
	tj.mu.Unlock()
	tj.wg.Go(func() {
		if err := metrics.Serve(tj.ctx, ln, reg, nil); err != nil {
			tj.serveErr <- err
		}
	})
	return n, nil
}

// reserve serves node id with the process's series only, as a process started but not yet a
// member of the job does; addServer adds the server's series once it is.
func (tj *testJob) reserve(id, role string) *node {
	tj.t.Helper()
	n, err := tj.serve(id, role, nil)
	require.NoError(tj.t, err)
	return n
}

// addServer serves the metrics of a server of the job, on its reserved node if it has one.
func (tj *testJob) addServer(s *ps.Server) *node {
	m, err := metrics.NewServer(s, metrics.Config{Job: jobName})
	require.NoError(tj.t, err)
	tj.mu.Lock()
	n := tj.nodes[s.ID()]
	tj.mu.Unlock()
	if n != nil {
		require.NoError(tj.t, n.reg.Register(m))
		return n
	}
	n, err = tj.serve(s.ID(), "ps", m)
	require.NoError(tj.t, err)
	return n
}

// stepFunc is worker id's training: pull the batch's rows, compute a squared loss and its
// gradient, push it; each phase timed into the worker's metrics.
func (tj *testJob) stepFunc(id string, pace time.Duration) (local.StepFunc, error) {
	tj.mu.Lock()
	ws := tj.workers[id]
	tj.mu.Unlock()
	if ws == nil {
		m, err := metrics.NewWorker(metrics.Config{Job: jobName, Node: id})
		if err != nil {
			return nil, err
		}
		ws = &workerState{m: m}
		if _, err := tj.serve(id, "worker", m); err != nil {
			return nil, err
		}
		tj.mu.Lock()
		tj.workers[id] = ws
		tj.mu.Unlock()
	}
	var tick *time.Ticker
	if pace > 0 {
		tick = time.NewTicker(pace)
	}
	return func(ctx context.Context, b *elastic.Batch) error {
		if tick != nil {
			// Pacing, not waiting for an event: it leaves the test's two cores to the servers
			// and the scraper.
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		t0 := time.Now()
		rows := make([]float32, dim*len(b.IDs))
		if err := b.Pull(ctx, "emb", b.IDs, rows); err != nil {
			return err
		}
		t1 := time.Now()
		// The gradient reaches only the rows of positive records, so that pushes carry fewer
		// rows than pulls.
		var loss float64
		var ids []uint64
		var grads []float32
		for i, id := range b.IDs {
			for k := range dim {
				d := rows[i*dim+k] - b.Labels[i]
				loss += float64(d * d)
				if b.Labels[i] > 0 {
					grads = append(grads, 0.1*d)
				}
			}
			if b.Labels[i] > 0 {
				ids = append(ids, id)
			}
		}
		loss /= float64(len(rows))
		t2 := time.Now()
		if err := b.Push(ctx, "emb", ids, grads); err != nil {
			return err
		}
		ws.m.ObserveStep(metrics.Step{Pull: t1.Sub(t0), Compute: t2.Sub(t1), Push: time.Since(t2), Samples: b.Len(), Loss: loss})
		tj.mu.Lock()
		ws.steps++
		ws.samples += b.Len()
		ws.loss = loss
		tj.mu.Unlock()
		return nil
	}, nil
}

func (tj *testJob) close() {
	tj.scaler.Close()
	tj.job.Close()
	tj.stop()
	tj.wg.Wait()
	close(tj.serveErr)
	for err := range tj.serveErr {
		tj.t.Errorf("serving metrics: %v", err)
	}
}

// node returns node id's registry and address.
func (tj *testJob) node(id string) *node {
	tj.mu.Lock()
	defer tj.mu.Unlock()
	n := tj.nodes[id]
	require.NotNil(tj.t, n, "no node %s", id)
	return n
}

// nodeIDs returns the ids of the nodes served.
func (tj *testJob) nodeIDs() []string {
	tj.mu.Lock()
	defer tj.mu.Unlock()
	var ids []string
	for id := range tj.nodes {
		ids = append(ids, id)
	}
	return ids
}

// scrape fetches a node's exposition over HTTP in the text format and parses it with
// Prometheus's text parser; it returns the text too.
func scrape(t *testing.T, addr string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+metrics.Path, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/plain")
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)
	return mfs, string(body)
}

// changedLocked wakes the waits.
func (tj *testJob) changedLocked() {
	close(tj.changed)
	tj.changed = make(chan struct{})
}

// wait waits until ok, called with tj.mu held, holds.
func (tj *testJob) wait(what string, ok func() bool) {
	tj.t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		tj.mu.Lock()
		done, ch := ok(), tj.changed
		tj.mu.Unlock()
		if done {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			tj.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitEvents waits until ok holds of the checkpoint events observed.
func (tj *testJob) waitEvents(ok func([]elastic.CheckpointEvent) bool) {
	tj.t.Helper()
	tj.wait("the checkpoint events", func() bool { return ok(tj.events) })
}

// waitNode waits until node id is served, and returns it.
func (tj *testJob) waitNode(id string) *node {
	tj.t.Helper()
	tj.wait("node "+id, func() bool { return tj.nodes[id] != nil })
	return tj.node(id)
}
