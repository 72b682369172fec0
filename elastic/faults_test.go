package elastic_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The model of the fault tests: record i has one id and a gradient of small integers, and the
// table starts at zero and learns by SGD at rate 1, so a row's value is exactly minus the sum of
// the gradients applied to it, in any order: a batch lost or applied twice shows, bit for bit.
const (
	faultRecords = 3072
	faultEpochs  = 2
	faultDim     = 4
	faultSlots   = 64
)

func faultID(i int64) uint64 { return uint64(i%61) * 0x9e3779b97f4a7c15 }

func faultGrad(i int64, g []float32) {
	g[0], g[1], g[2], g[3] = float32(i%5+1), -float32(i%3), 1, float32(i%7)
}

var faultTable = ps.TableSpec{Name: "emb", Config: embedding.Config{Dim: faultDim, Seed: 1,
	Init:      embedding.Init{Kind: embedding.InitZeros},
	Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 1}}}

// withoutLost takes out of want (faultExpected's rows) the updates of the positions lost on the
// failed slots, and returns how many positions lost lists.
func withoutLost(want map[uint64][]float32, lost []elastic.Span, failed *embedding.SlotSet) int64 {
	var n int64
	g := make([]float32, faultDim)
	for _, sp := range lost {
		n += sp.To - sp.From
		for p := sp.From; p < sp.To; p++ {
			id := faultID(p)
			if !failed.Has(embedding.Slot(id, faultSlots)) {
				continue
			}
			faultGrad(p, g)
			for k := range g {
				want[id][k] += g[k] // the update that was lost
			}
		}
	}
	return n
}

// faultExpected is every row after each record was trained exactly once per epoch.
func faultExpected() map[uint64][]float32 {
	want := map[uint64][]float32{}
	g := make([]float32, faultDim)
	for e := 0; e < faultEpochs; e++ {
		for i := int64(0); i < faultRecords; i++ {
			id := faultID(i)
			if want[id] == nil {
				want[id] = make([]float32, faultDim)
			}
			faultGrad(i, g)
			for j := range g {
				want[id][j] -= g[j]
			}
		}
	}
	return want
}

// serverRows returns the table's weights over servers.
func serverRows(servers []*ps.Server) map[uint64][]float32 {
	out := map[uint64][]float32{}
	for _, s := range servers {
		t, _ := s.Table("emb")
		t.Range(func(v embedding.RowView) bool {
			out[v.ID] = append([]float32(nil), v.Weights...)
			return true
		})
	}
	return out
}

// faultJob is a job whose every process talks over one in-memory network: servers ps-0..,
// the coordinator's dispatcher and control calls on host "coord", workers on their own hosts.
type faultJob struct {
	t       *testing.T
	net     *memnet.Network
	secret  []byte
	store   checkpoint.Storage
	shm     string
	servers []*ps.Server
	locals  []*server.Server
	coord   *elastic.Coordinator
	addr    string // the coordinator's
	wg      sync.WaitGroup
	close   func() // stops everything; the shared-memory regions stay
	closers []func()

	mu     sync.Mutex // guards servers and locals once training runs
	dead   map[int]bool
	logger *slog.Logger // for the workers; nil discards
}

func startFaultJob(t *testing.T, n int, store checkpoint.Storage, shm string) *faultJob {
	return startFaultJobWith(t, n, store, shm, nil)
}

// startFaultJobWith starts a fault job whose coordinator's Config tune adjusts.
func startFaultJobWith(t *testing.T, n int, store checkpoint.Storage, shm string, tune func(*elastic.Config)) *faultJob {
	j := &faultJob{t: t, net: memnet.New(memnet.Config{}), secret: []byte("a secret of the fault tests....."), store: store, shm: shm}
	ctx := context.Background()
	var nodes []elastic.ParameterServer
	for i := range n {
		id := fmt.Sprintf("ps-%d", i)
		srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: j.secret, Slots: faultSlots, Tables: []ps.TableSpec{faultTable}, Transport: j.net.Host(id)})
		require.NoError(t, err)
		l, err := j.net.Host(id).Listen(id + ":1")
		require.NoError(t, err)
		ls, err := server.New(srv, l.Addr().String(), checkpoint.Config{Job: "faults", Storage: store, ShmDir: shm, FullEvery: 3})
		require.NoError(t, err)
		j.serve(func() { srv.Serve(l) })
		j.servers, j.locals = append(j.servers, srv), append(j.locals, ls)
		nodes = append(nodes, ls)
	}
	cfg := elastic.Config{
		Job: "faults", Servers: nodes, Slots: faultSlots, Storage: store, CheckpointEvery: 8,
		WorkerSilence: 400 * time.Millisecond, ArriveTimeout: time.Second,
		Dispatcher: shard.Config{Dataset: shard.IndexedDataset(faultRecords), ShardSize: 96, Epochs: faultEpochs,
			Seed: 3, Shuffle: true, LeaseTTL: 2 * time.Second, RetryAfter: 100 * time.Millisecond},
	}
	// Slots move between servers (live repartition) over the same network; servers a test
	// starts are reached through their control calls.
	cfg.Secret, cfg.Transport = j.secret, j.net.Host("coord")
	cfg.ServerAt = func(node ps.Node) (elastic.ParameterServer, error) {
		return remote.NewServer(node, remote.Config{Secret: j.secret, Transport: j.net.Host("coord")})
	}
	if tune != nil {
		tune(&cfg)
	}
	var err error
	j.coord, err = elastic.NewCoordinator(ctx, cfg)
	require.NoError(t, err)
	dsrv, err := shardnet.NewServer(shardnet.ServerConfig{Service: j.coord.Service(), Secret: j.secret})
	require.NoError(t, err)
	require.NoError(t, remote.ServeControl(dsrv, j.coord))
	l, err := j.net.Host("coord").Listen("coord:1")
	require.NoError(t, err)
	j.addr = l.Addr().String()
	j.serve(func() { dsrv.Serve(l) })
	j.close = sync.OnceFunc(func() {
		for _, f := range j.closers {
			f()
		}
		dsrv.Close()
		j.coord.Close()
		j.mu.Lock()
		defer j.mu.Unlock()
		for i, s := range j.servers {
			s.Close()
			j.locals[i].Close()
		}
		j.wg.Wait()
	})
	t.Cleanup(j.close)
	return j
}

func (j *faultJob) serve(f func()) {
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		f()
	}()
}

var faultData = shard.IndexedSource{Data: shard.IndexedFunc(faultRecords, func(i int64, rec *shard.Record) error {
	rec.IDs = append(rec.IDs, faultID(i))
	rec.EndField()
	rec.Label = float32(i % 2)
	return nil
})}

// worker is one worker process on its own host: its client, its dispatcher client and its
// coordinator client all go over the host's links.
type faultWorker struct {
	name string
	cli  *ps.Client
	sess *elastic.Session
}

func (j *faultJob) worker(name string) *faultWorker {
	return j.workerWith(name, nil)
}

// workerWith is worker whose calls to the coordinator go through wrap (nil: none).
func (j *faultJob) workerWith(name string, wrap func(elastic.Control) elastic.Control) *faultWorker {
	return j.workerAt(name, name, wrap)
}

// workerOn is worker with a host of its own: a second process under a name another one uses.
func (j *faultJob) workerOn(host, name string) *faultWorker {
	return j.workerAt(host, name, nil)
}

// workerAt is a worker named name on the memory network's host, its calls to the coordinator
// through wrap (nil: none).
func (j *faultJob) workerAt(host, name string, wrap func(elastic.Control) elastic.Control) *faultWorker {
	h := j.net.Host(host)
	cli, err := ps.NewClient(ps.ClientConfig{Secret: j.secret, Transport: h, Resolver: j.coord, Retries: 4, RetryBackoff: time.Millisecond})
	require.NoError(j.t, err)
	svc, err := shardnet.NewClient(shardnet.ClientConfig{Addr: j.addr, Secret: j.secret, Transport: h})
	require.NoError(j.t, err)
	ctl, err := remote.NewControl(remote.Config{Addr: j.addr, Secret: j.secret, Transport: h})
	require.NoError(j.t, err)
	var control elastic.Control = ctl
	if wrap != nil {
		control = wrap(ctl)
	}
	sess, err := elastic.NewSession(elastic.SessionConfig{Worker: name, Control: control, Client: cli,
		Reader: shard.ReaderConfig{Service: svc, Source: faultData, BatchSize: 32}, Logger: j.logger})
	require.NoError(j.t, err)
	j.closers = append(j.closers, func() {
		sess.Close()
		ctl.Close()
		svc.Close()
		cli.Close()
	})
	return &faultWorker{name: name, cli: cli, sess: sess}
}

// assertEveryEpochOnce checks that every position of every epoch was trained exactly once, and
// that every epoch is complete with no shard given up.
func assertEveryEpochOnce(t *testing.T, c *elastic.Coordinator) {
	t.Helper()
	for _, e := range c.ExactlyOnce() {
		assert.True(t, e.OK(), "%s", e)
		assert.True(t, e.Complete, "%s", e)
		assert.Zero(t, e.Failed, "%s", e)
	}
}

// trainStep pushes the batch's gradients.
func trainStep(ctx context.Context, b *elastic.Batch) error {
	g := make([]float32, faultDim*b.Len())
	for k := range b.Len() {
		faultGrad(recordIndex(b, k), g[k*faultDim:(k+1)*faultDim])
	}
	return b.Push(ctx, "emb", b.IDs, g)
}

// recordIndex is the dataset index of the batch's k-th record (records are not shuffled within
// a shard).
func recordIndex(b *elastic.Batch, k int) int64 {
	return b.Shard.Global(b.RecordOffsets[k])
}

// run trains until the data is done, then leaves.
func (w *faultWorker) run(ctx context.Context, step func(ctx context.Context, b *elastic.Batch) error) error {
	defer w.sess.Close()
	for {
		err := w.sess.Step(ctx, step)
		switch {
		case err == nil:
		case errors.Is(err, io.EOF), errors.Is(err, elastic.ErrStopped):
			return nil
		default:
			return err
		}
	}
}

// Workers crash in the middle of their pushes and are cut off from the coordinator (not from
// the servers) while training runs with checkpoints; the job goes on. At the end every position
// was trained exactly once per epoch (the coordinator's ledger against the dispatcher), every
// row equals the failure-free result bit for bit (a batch half applied by a dead worker and
// replayed by another lands once), and the final checkpoint restores onto one server exactly.
func TestWorkerFailuresKeepEveryBatchExactlyOnce(t *testing.T) {
	store := checkpoint.NewMemStorage()
	shm := t.TempDir()
	j := startFaultJob(t, 2, store, shm)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stop := make(chan struct{}) // ends the crashed worker's goroutine at the end of the test
	var crashedPush, zombiePush, fencedPush error

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i, name := range []string{"w0", "w1"} {
		w := j.worker(name)
		wg.Go(func() { errs[i] = w.run(ctx, trainStep) })
	}
	// crash: at its third batch, its pushes reach ps-0 but not ps-1, and then it is gone.
	crash := j.worker("crash")
	n := 0
	wg.Go(func() {
		errs[2] = crash.run(ctx, func(ctx context.Context, b *elastic.Batch) error {
			if n++; n < 3 {
				return trainStep(ctx, b)
			}
			j.net.SetDrop("crash", "ps-1", true)
			pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			crashedPush = trainStep(pctx, b)
			cancel()
			j.net.Kill("crash")
			<-stop
			return errors.New("crashed")
		})
	})
	// cut: at its third batch, it loses the coordinator but not the servers. It pushes the
	// batch (which lands: it is not fenced yet) and cannot report it; the coordinator fails it
	// and its shard goes to others, who replay the batch; its later push is refused.
	cut := j.worker("cut")
	m := 0
	wg.Go(func() {
		errs[3] = cut.run(ctx, func(ctx context.Context, b *elastic.Batch) error {
			if m++; m != 3 {
				return trainStep(ctx, b)
			}
			j.net.Partition("cut", "coord")
			zombiePush = trainStep(ctx, b)
			for slices.Contains(j.coord.Members(), "cut") {
				time.Sleep(5 * time.Millisecond) // until the coordinator has failed it
			}
			if err := j.coord.Settle(ctx); err != nil { // and fenced it on every server
				return err
			}
			g := make([]float32, faultDim*b.Len())
			fencedPush = cut.cli.Push(ctx, "emb", b.IDs, g, b.Step, ps.At(ps.Position{Shard: 1 << 20, Start: 0, End: 1}))
			j.net.Heal("cut", "coord")
			return nil
		})
	})
	waitWorkers := func() {
		done := make(chan struct{})
		go func() {
			// Everyone but the crashed worker finishes the data.
			for !j.coord.Dispatcher().Progress().Finished {
				time.Sleep(5 * time.Millisecond)
			}
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("the job did not finish")
		}
	}
	waitWorkers()
	j.net.Restart("crash") // what is left of it may say goodbye: it is no member any more
	close(stop)
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.NoError(t, errs[3], "the cut-off worker joined again and went on")
	require.Error(t, crashedPush, "the crashed worker's push reached only one server")
	require.NoError(t, zombiePush, "a worker cut off from the coordinator still reaches the servers")
	require.ErrorIs(t, fencedPush, ps.ErrFenced, "once failed, its pushes are refused")

	_, err := j.coord.Checkpoint(ctx)
	require.NoError(t, err)
	assertEveryEpochOnce(t, j.coord)
	assert.Equal(t, faultExpected(), serverRows(j.servers), "every row holds every record once per epoch")
	st := j.coord.Status()
	assert.GreaterOrEqual(t, st.Evicted, 2, "both faulty workers were failed")
	assert.LessOrEqual(t, st.Evicted, 3, "and no healthy one (the cut-off one may be failed again while it rejoins)")
	t.Logf("%d steps, %d checkpoints committed, %d epochs fenced, %d workers failed", st.Step, st.Commits, st.Fenced, st.Evicted)

	// The final checkpoint restores onto one server exactly.
	j.close()
	one := startFaultJob(t, 1, store, shm)
	_, _, err = one.coord.Resume(ctx)
	require.NoError(t, err)
	assert.Equal(t, faultExpected(), serverRows(one.servers))
}

// A worker failed while the coordinator is busy learns of it, joins again and takes a shard
// before its eviction is carried out: the eviction takes back only what the worker held when it
// was failed. The lease of its new membership stays, and no shard counts a failure for it (with
// MaxFailures 1 it would be given up, its records never trained). Whether the worker handed its
// old shard back first (a Session does) or not (a new process under the same name), the old
// lease is gone at the end.
func TestLateEvictionSparesTheNextMembershipsLeases(t *testing.T) {
	for _, handBack := range []bool{true, false} {
		t.Run(fmt.Sprintf("hand_back=%t", handBack), func(t *testing.T) { testLateEviction(t, handBack) })
	}
}

func testLateEviction(t *testing.T, handBack bool) {
	var servers []*elastictest.FaultServer // their fences wait while the test holds them
	j := startFaultJobWith(t, 1, checkpoint.NewMemStorage(), t.TempDir(), func(c *elastic.Config) {
		c.Dispatcher.MaxFailures = 1
		c.CheckpointEvery = 0
		c.WorkerSilence = -1 // only the test fails the worker
		for i, s := range c.Servers {
			f := elastictest.NewFaultServer(s)
			servers = append(servers, f)
			c.Servers[i] = f
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	svc := j.coord.Service()
	epoch, err := j.coord.Join(ctx, "w", 32)
	require.NoError(t, err)
	first, err := svc.Acquire(ctx, "w")
	require.NoError(t, err)
	require.NoError(t, svc.Report(ctx, "w", first.ID, 32, false))

	release := make(chan struct{})
	for _, f := range servers {
		f.Inject(elastictest.Rule{Method: elastictest.MethodFence, Hold: release})
	}
	j.coord.Fail("w", "cut off")
	require.ErrorIs(t, j.coord.Begin(ctx, "w", epoch), elastic.ErrNotMember)
	if handBack {
		require.NoError(t, svc.Leave(ctx, "w"))
	}
	_, err = j.coord.Join(ctx, "w", 32)
	require.NoError(t, err)
	next, err := svc.Acquire(ctx, "w")
	require.NoError(t, err)
	close(release)
	require.NoError(t, j.coord.Settle(ctx))

	require.NoError(t, svc.Report(ctx, "w", next.ID, 32, false), "the new membership's lease was taken by the old one's eviction")
	require.ErrorIs(t, svc.Report(ctx, "w", first.ID, 64, false), shard.ErrStaleLease, "the failed membership's lease survived its eviction")
	failed := j.coord.Dispatcher().Progress().Failed
	if handBack {
		assert.Empty(t, failed, "a shard handed back counts no failure")
	} else {
		require.Len(t, failed, 1, "the shard the failed membership kept counts its failure")
		assert.Equal(t, first.Shard.Index, failed[0].Shard.Index)
		assert.Equal(t, int64(32), failed[0].Offset)
	}
	assert.Equal(t, 1, j.coord.Status().Evicted)
}
