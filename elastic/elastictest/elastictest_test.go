package elastictest

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var testTable = ps.TableSpec{Name: "emb", Config: embedding.Config{Dim: 2, Seed: 1,
	Init:      embedding.Init{Kind: embedding.InitZeros},
	Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 1}}}

const testRecords = 512

var testData = shard.IndexedSource{Data: shard.IndexedFunc(testRecords, func(i int64, rec *shard.Record) error {
	rec.IDs = append(rec.IDs, uint64(i%37))
	rec.EndField()
	return nil
})}

// testStep pushes a gradient of 1 for every id of the batch.
func testStep(ctx context.Context, b *elastic.Batch) error {
	g := make([]float32, 2*len(b.IDs))
	for i := range g {
		g[i] = 1
	}
	return b.Push(ctx, "emb", b.IDs, g)
}

func startTestJob(t *testing.T, servers int, wrap func(elastic.ParameterServer) elastic.ParameterServer) *Job {
	t.Helper()
	j, err := Start(context.Background(), Config{T: t, Servers: servers, Tables: []ps.TableSpec{testTable}, WrapServer: wrap,
		Coordinator: elastic.Config{Dispatcher: shard.Config{Dataset: shard.IndexedDataset(testRecords), ShardSize: 64, RetryAfter: 10 * time.Millisecond}}})
	require.NoError(t, err)
	return j
}

func TestClock(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := NewClock(start)
	assert.Equal(t, start, c.Now())
	c.Advance(time.Minute)
	assert.Equal(t, start.Add(time.Minute), c.Now())
	c.Advance(-time.Second)
	assert.Equal(t, start.Add(59*time.Second), c.Now())
}

// Two workers on their own hosts train the data to its end; every record lands once, and the
// job closes (twice) when asked and again at the test's end.
func TestJobTrainsEveryRecordOnce(t *testing.T) {
	j := startTestJob(t, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		sess, err := j.Session(elastic.WorkerID(i), shard.ReaderConfig{Source: testData, BatchSize: 16})
		require.NoError(t, err)
		wg.Go(func() {
			defer sess.Close()
			for {
				err := sess.Step(ctx, testStep)
				if errors.Is(err, io.EOF) || errors.Is(err, elastic.ErrStopped) {
					return
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	counts := map[uint64]float32{}
	for i := range int64(testRecords) {
		counts[uint64(i%37)]--
	}
	rows := map[uint64]float32{}
	for _, s := range j.Servers() {
		tab, ok := s.Table("emb")
		require.True(t, ok)
		tab.Range(func(v embedding.RowView) bool {
			rows[v.ID] = v.Weights[0]
			return true
		})
	}
	assert.Equal(t, counts, rows, "every record's gradient applied once")
	for _, e := range j.Coordinator().ExactlyOnce() {
		assert.True(t, e.OK(), "%s", e)
	}
	require.NoError(t, j.Close())
	require.NoError(t, j.Close(), "idempotent")
	_, err := j.Session("late", shard.ReaderConfig{Source: testData, BatchSize: 16})
	assert.ErrorIs(t, err, elastic.ErrClosed)
}

// A FaultServer's rules apply in order, skip and count as told, hold a call until released and
// fail it without reaching the server.
func TestFaultServerRules(t *testing.T) {
	var fs *FaultServer
	j := startTestJob(t, 1, func(s elastic.ParameterServer) elastic.ParameterServer {
		fs = NewFaultServer(s)
		return fs
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = j
	healthBefore := fs.Count(MethodHealth)
	errDown := errors.New("down")
	// The second and third Table calls fail; the first and the fourth reach the server.
	down := fs.Inject(Rule{Method: MethodTable, Skip: 1, Times: 2, Err: errDown})
	for i, want := range []error{nil, errDown, errDown, nil} {
		tab, err := fs.Table(ctx)
		require.ErrorIs(t, err, want, "call %d", i+1)
		if want == nil {
			require.NotNil(t, tab, "the server answered")
		}
	}
	hits := down.Hits()
	require.Len(t, hits, 2)
	assert.Equal(t, []int{2, 3}, []int{hits[0].N, hits[1].N})
	assert.Equal(t, "ps-0", hits[0].Server)

	// A held call is counted as it arrives, and goes on once released.
	release := make(chan struct{})
	held := fs.Inject(Rule{Method: MethodRestore, Match: func(c Call) bool { return c.Step == 0 }, Hold: release})
	tab, err := fs.Table(ctx)
	require.NoError(t, err)
	restored := make(chan error, 1)
	go func() { restored <- fs.Restore(ctx, 0, tab, elastic.RestoreNew) }()
	c, err := held.Wait(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, elastic.RestoreNew, c.Mode)
	assert.Same(t, tab, c.Table)
	select {
	case err := <-restored:
		t.Fatalf("the held call returned: %v", err)
	default:
	}
	close(release)
	require.NoError(t, <-restored)

	// A held call whose context ends fails with the context's error.
	fs.Inject(Rule{Method: MethodVerify, Hold: make(chan struct{})})
	short, cancelShort := context.WithCancel(ctx)
	cancelShort()
	assert.ErrorIs(t, fs.Verify(short, 1, tab), context.Canceled)

	// A rule of every method; the first rule that applies decides.
	all := fs.Inject(Rule{Err: errDown})
	_, err = fs.Health(ctx)
	assert.ErrorIs(t, err, errDown)
	assert.Len(t, all.Hits(), 1)
	fs.Remove(all)
	_, err = fs.Health(ctx)
	assert.NoError(t, err)
	assert.GreaterOrEqual(t, fs.Count(MethodHealth), healthBefore+2, "counted, failed or not")
	fs.Clear()
	_, err = fs.Health(ctx)
	assert.NoError(t, err, "no rule left")
	assert.Equal(t, "InstallTable", MethodInstallTable.String())
}

// recorderHarness runs the Recorder under TestScaler, with servers from a Job; wrap, if set,
// makes it break the contract.
func recorderHarness(wrap func(*Recorder) elastic.Scaler) ScalerHarness {
	return func(t *testing.T, servers int) ScalerUnderTest {
		j := startTestJob(t, servers, nil)
		r := NewRecorder(RecorderConfig{Servers: servers, Pool: j})
		var s elastic.Scaler = r
		if wrap != nil {
			s = wrap(r)
		}
		return ScalerUnderTest{Scaler: s, Await: func(ctx context.Context, cond func(Procs) bool) (Procs, error) {
			// The recorder's processes change only by the calls the test makes.
			if p := r.Procs(); cond(p) {
				return p, nil
			}
			return nil, errors.New("the recorder's processes change only by its calls")
		}}
	}
}

func TestRecorderMeetsTheScalerContract(t *testing.T) {
	TestScaler(t, recorderHarness(nil))
}

// serverScaling breaks the contract as the process scaler once did: Scale changes the servers.
type serverScaling struct{ *Recorder }

func (s serverScaling) Scale(ctx context.Context, plan elastic.Plan) error {
	if have := s.Plan().Servers; plan.Servers > have && plan.Validate() == nil {
		if _, err := s.StartServers(ctx, plan.Servers-have); err != nil {
			return err
		}
	}
	return s.Recorder.Scale(ctx, plan)
}

// restarting breaks it by starting every worker anew at each Scale.
type restarting struct{ *Recorder }

func (s restarting) Scale(ctx context.Context, plan elastic.Plan) error {
	if plan.Validate() == nil {
		p := s.Plan()
		p.Workers = 0
		s.Recorder.Scale(ctx, p)
	}
	return s.Recorder.Scale(ctx, plan)
}

// TestScaler fails a scaler that breaks the contract, and says how.
func TestScalerCatchesBrokenScalers(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap func(*Recorder) elastic.Scaler
		want string
	}{
		{"scale changes the servers", func(r *Recorder) elastic.Scaler { return serverScaling{r} }, "want an error wrapping ErrInvalidConfig"},
		{"scale restarts the workers", func(r *Recorder) elastic.Scaler { return restarting{r} }, "worker-0 was restarted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := checkScaler(t, recorderHarness(tc.wrap))
			require.NotEmpty(t, errs)
			var msgs []string
			for _, err := range errs {
				msgs = append(msgs, err.Error())
			}
			assert.Contains(t, strings.Join(msgs, "\n"), tc.want)
		})
	}
}

// The recorder fails the calls it is told to, changing nothing, and records them.
func TestRecorderFailsOnDemand(t *testing.T) {
	ctx := context.Background()
	r := NewRecorder(RecorderConfig{})
	quota := errors.New("quota exceeded")
	require.NoError(t, r.Scale(ctx, elastic.Plan{Servers: 2, Workers: 1}))
	r.Fail(OpScale, quota)
	assert.ErrorIs(t, r.Scale(ctx, elastic.Plan{Servers: 2, Workers: 3}), quota)
	assert.Equal(t, elastic.Plan{Servers: 2, Workers: 1}, r.Plan())
	assert.Equal(t, Procs{"ps-0": "1", "ps-1": "1", "worker-0": "1"}, r.Procs())
	r.Fail(OpScale, nil)
	require.NoError(t, r.Scale(ctx, elastic.Plan{Servers: 2, Workers: 2}))
	_, err := r.StartServers(ctx, 1)
	assert.ErrorIs(t, err, errors.ErrUnsupported, "no pool")
	assert.Equal(t, []elastic.Plan{{Servers: 2, Workers: 1}, {Servers: 2, Workers: 2}}, r.Plans())
	calls := r.Calls()
	require.Len(t, calls, 4)
	assert.Equal(t, "Scale(2 servers, 3 workers): quota exceeded", calls[1].String())
	require.NoError(t, r.Close())
	assert.ErrorIs(t, r.Scale(ctx, elastic.Plan{Servers: 2}), elastic.ErrClosed)
}
