package train_test

import (
	"context"
	"errors"
	"fmt"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic/statuspage"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// smallSynth is an 8-field synthetic data set that a small model learns within seconds; its
// hidden model's AUC is about 0.8, and a model whose embeddings do not learn stays near 0.63.
var smallSynth = model.SynthConfig{
	DenseFeatures: 8,
	Vocab:         []int{3, 10, 50, 200, 1000, 5000, 20000, 100},
	Hotness:       []int{1, 1, 1, 3, 1, 1, 1, 4},
	ZipfExponent:  1.2,
}

// smallConfig is a quick synthetic run: a small model, small shards, no periodic evaluation.
func smallConfig(t *testing.T, records int64, epochs int) train.Config {
	return train.Config{
		Synth: smallSynth, TrainRecords: records, TestRecords: 10000, Epochs: epochs, Seed: 7,
		EmbeddingDim: 8, BottomHidden: []int{16}, TopHidden: []int{32, 16}, BatchSize: 128,
		ShardSize: 1024, CheckpointEvery: int(records) * epochs / 128 / 4, EvalEvery: -1,
		CheckpointDir: t.TempDir(), ShmDir: t.TempDir(),
	}
}

// totalTrained sums the positions the ledger counted over every epoch.
func checkExactlyOnce(t *testing.T, s *train.Summary, records int64, epochs int) {
	t.Helper()
	require.Len(t, s.Epochs, epochs, "epochs in the summary")
	for _, e := range s.Epochs {
		assert.True(t, e.OK(), "%s", e)
		assert.True(t, e.Complete, "%s", e)
		assert.Equal(t, records, e.Covered, "%s", e)
		assert.Zero(t, e.Duplicates, "%s", e)
	}
	assert.True(t, s.ExactlyOnce)
	assert.Equal(t, records*int64(epochs), s.TotalSamples, "the model saw every record once per epoch")
}

func TestSyntheticRunLearnsExactlyOnce(t *testing.T) {
	records, minAUC := int64(60000), 0.72
	if testing.Short() || raceEnabled {
		records, minAUC = 30000, 0.68
	}
	if raceEnabled {
		records, minAUC = 6000, 0.55
	}
	cfg := smallConfig(t, records, 2)
	var events []train.EventKind
	cfg.OnEvent = func(ev train.Event) { events = append(events, ev.Kind) }
	start := time.Now()
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	t.Logf("%d samples in %v: test AUC %.4f (hidden model %.4f), log loss %.4f; %d checkpoints, blocked %v on average",
		s.Samples, time.Since(start).Round(time.Millisecond), s.Eval.AUC, s.Ceiling.AUC, s.Eval.LogLoss, s.Checkpoints.Taken, s.Checkpoints.MeanBlocked())

	checkExactlyOnce(t, s, records, 2)
	assert.Equal(t, "every epoch done", s.StopReason)
	require.NotNil(t, s.Ceiling)
	assert.GreaterOrEqual(t, s.Eval.AUC, minAUC, "a trainer whose embeddings do not learn stays near 0.63")
	assert.Less(t, s.Eval.AUC, s.Ceiling.AUC+0.01, "no learner beats the hidden model")
	assert.Equal(t, 10000, s.Eval.Samples)
	assert.GreaterOrEqual(t, s.Checkpoints.Committed, 2, "periodic and final checkpoints")
	assert.Equal(t, uint64(s.Steps), s.Checkpoints.LastCommitted, "the final checkpoint holds the last step")
	assert.Zero(t, s.Checkpoints.Failed)
	assert.Contains(t, events, train.EventStart)
	assert.Contains(t, events, train.EventCheckpoint)
	assert.Contains(t, events, train.EventCommit)
	var embRows, dense int
	for _, tab := range s.Tables {
		if tab.Dense {
			dense++
		} else {
			embRows += tab.Rows
		}
	}
	assert.Equal(t, 8, len(s.Tables)-dense, "one embedding table per field")
	assert.Equal(t, 10, dense, "two bottom and three top layers, a weight and a bias each")
	assert.Positive(t, embRows)
	// Shared memory is released at the end; storage keeps the checkpoints.
	left, _ := filepath.Glob(filepath.Join(cfg.ShmDir, "*", "*"))
	assert.Empty(t, left, "shared-memory regions left behind")
}

// TestFirstOrderRun trains with first-order terms: every field has a table of scalars beside
// its embedding table on the servers, both are trained and checkpointed, and evaluating the final
// commit in fresh servers gives the run's own figures (a lost table of scalars would not).
func TestFirstOrderRun(t *testing.T) {
	records := int64(20000)
	if raceEnabled {
		records = 4000
	}
	cfg := smallConfig(t, records, 1)
	cfg.FirstOrder = train.SwitchOn
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	checkExactlyOnce(t, s, records, 1)
	t.Logf("first-order terms: test AUC %.4f (hidden model %.4f)", s.Eval.AUC, s.Ceiling.AUC)
	rows := map[string]int{}
	for _, tab := range s.Tables {
		rows[tab.Name] = tab.Rows
	}
	for f := 1; f <= len(smallSynth.Vocab); f++ {
		emb, bias := rows[fmt.Sprintf("emb.C%d", f)], rows[fmt.Sprintf("bias.C%d", f)]
		assert.Positive(t, emb, "field C%d", f)
		assert.Equal(t, emb, bias, "field C%d: a scalar for every row", f)
	}
	ev := cfg
	ev.Evaluate = "newest"
	se, err := train.Run(context.Background(), ev)
	require.NoError(t, err)
	assert.Equal(t, s.Eval.AUC, se.Eval.AUC, "the final commit evaluated again")
	assert.Equal(t, s.Eval.LogLoss, se.Eval.LogLoss)
	ev.FirstOrder = train.SwitchOff
	_, err = train.Run(context.Background(), ev)
	assert.Error(t, err, "a commit with first-order terms is not a model without")
}

// TestInterruptAndResume stops a run mid-epoch (an interrupt: final checkpoint; or a crash: no
// final checkpoint, so the last periodic one is restored and the records trained since are
// trained again), resumes it from the checkpoint directory, and checks that the data position
// was restored and that across both runs every record was trained exactly once per epoch.
func TestInterruptAndResume(t *testing.T) {
	records := int64(12000)
	if raceEnabled {
		records = 4000
	}
	for _, crash := range []bool{false, true} {
		name := "interrupt"
		if crash {
			name = "crash"
		}
		t.Run(name, func(t *testing.T) {
			cfg := smallConfig(t, records, 2)
			stopAt := int64(float64(records) * 0.7 / float64(cfg.BatchSize)) // in epoch 0
			cfg.CheckpointEvery = int(stopAt / 3)
			cfg.NoFinalCheckpoint = crash
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cfg.OnEvent = func(ev train.Event) {
				if ev.Progress.Steps >= stopAt {
					cancel()
				}
			}
			cfg.ProgressEvery = 10 * time.Millisecond
			first, err := train.Run(ctx, cfg)
			require.NoError(t, err)
			assert.Equal(t, "interrupted", first.StopReason)
			assert.Less(t, first.TotalSamples, records*2, "stopped before the end")
			require.Positive(t, first.Checkpoints.Committed)
			for _, e := range first.Epochs {
				assert.True(t, e.OK(), "first run: %s", e)
			}
			if !crash {
				assert.Equal(t, uint64(first.Steps), first.Checkpoints.LastCommitted, "final checkpoint at the last step")
			}

			cfg.Resume, cfg.OnEvent, cfg.NoFinalCheckpoint = true, nil, false
			second, err := train.Run(context.Background(), cfg)
			require.NoError(t, err)
			require.True(t, second.Resumed)
			assert.Equal(t, first.Checkpoints.LastCommitted, second.ResumedStep, "resumed from the newest commit")
			if crash {
				assert.LessOrEqual(t, second.ResumedSamples, first.TotalSamples, "a crash loses what followed the last checkpoint")
			} else {
				assert.Equal(t, first.TotalSamples, second.ResumedSamples, "the final checkpoint holds everything trained")
			}
			assert.Equal(t, records*2-second.ResumedSamples, second.Samples, "the second run trains only what was left")
			checkExactlyOnce(t, second, records, 2)
		})
	}
}

// A checkpoint attempted at every poll, each one full, keeps both generations of every server
// busy persisting, so many snapshots are skipped (checkpoint.ErrBusy); the final checkpoint is
// never one of them: it waits for the persists and holds the last step.
func TestFinalCheckpointSurvivesBusyGenerations(t *testing.T) {
	records := int64(20000)
	if raceEnabled {
		records = 6000
	}
	cfg := smallConfig(t, records, 1)
	cfg.CheckpointEvery, cfg.FullEvery = 1, 1
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	t.Logf("%d steps: %d checkpoints taken, %d skipped, %d committed", s.Steps, s.Checkpoints.Taken, s.Checkpoints.Skipped, s.Checkpoints.Committed)
	assert.Equal(t, uint64(s.Steps), s.Checkpoints.LastCommitted, "the final checkpoint holds the last step")
	assert.Zero(t, s.Checkpoints.Failed)
	checkExactlyOnce(t, s, records, 1)
}

func TestResumeRefusesOtherJobs(t *testing.T) {
	cfg := smallConfig(t, 2000, 1)
	_, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)

	other := cfg
	other.Resume, other.EmbeddingDim = true, 4
	_, err = train.Run(context.Background(), other)
	assert.ErrorIs(t, err, train.ErrMismatch)

	// Another batch size is refused before any training, not by every worker's join after it.
	batch := cfg
	batch.Resume, batch.BatchSize = true, cfg.BatchSize*2
	sum, err := train.Run(context.Background(), batch)
	assert.ErrorIs(t, err, train.ErrMismatch)
	assert.ErrorContains(t, err, fmt.Sprintf("batches of %d records", cfg.BatchSize))
	assert.True(t, sum == nil, "refused before training, with no summary of a run that did not happen")

	empty := smallConfig(t, 2000, 1)
	empty.Resume = true
	_, err = train.Run(context.Background(), empty)
	assert.ErrorIs(t, err, train.ErrNoCheckpoint)
}

// TestMovieLensAUC trains on MovieLens latest-small with a seeded 80/20 split, three seeds (two
// workers training asynchronously), with the defaults for MovieLens (chosen on a validation split
// of the training ratings, never on this test split: see DefaultMovieLensDim and
// DefaultMovieLensMinCount). An L2-regularised logistic regression on one-hot user, movie and
// genres reaches AUC 0.784 on such a split; the DLRM with the reader's fields alone reached 0.801
// on average, and with user_day, the frequency threshold and the concatenated embeddings it
// reaches about 0.812 (0.809 to 0.814 per seed): it must reach 0.805 on average.
func TestMovieLensAUC(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "..", "shared", "data", "movielens-latest-small")
	if _, err := os.Stat(filepath.Join(dir, "ratings.csv")); err != nil {
		if os.Getenv("CI") == "true" { // under CI a missing data path fails, never turns the test off
			t.Fatalf("MovieLens data not found at %s, and CI must run the MovieLens AUC test: %v", dir, err)
		}
		t.Skipf("MovieLens data not found at %s (the project's shared data directory): %v", dir, err)
	}
	if raceEnabled {
		t.Skip("numeric training test, about 15x slower under the race detector; covered by plain go test")
	}
	spec, err := train.ParseDataSpec("movielens:" + dir)
	require.NoError(t, err)
	var sum float64
	seeds := []uint64{1, 2, 3}
	for _, seed := range seeds {
		cfg := train.Config{Data: spec, Seed: seed, EvalEvery: -1, CheckpointEvery: 500,
			CheckpointDir: t.TempDir(), ShmDir: t.TempDir()}
		start := time.Now()
		s, err := train.Run(context.Background(), cfg)
		require.NoError(t, err)
		t.Logf("MovieLens seed %d: test AUC %.4f, log loss %.4f on %d ratings after %d samples (%.0f samples/s) in %v",
			seed, s.Eval.AUC, s.Eval.LogLoss, s.Eval.Samples, s.Samples, s.SamplesPerSec, time.Since(start).Round(time.Millisecond))
		sum += s.Eval.AUC
		assert.Equal(t, 20167, s.Eval.Samples, "20% of 100 836 ratings held out")
		checkExactlyOnce(t, s, 100836-20167, 3)
	}
	mean := sum / float64(len(seeds))
	t.Logf("MovieLens: mean test AUC %.4f over %d seeds", mean, len(seeds))
	assert.GreaterOrEqual(t, mean, 0.805)
}

func TestParseDataSpec(t *testing.T) {
	for _, c := range []struct {
		in   string
		want train.DataSpec
	}{
		{"", train.DataSpec{Kind: train.Synthetic}},
		{"synthetic", train.DataSpec{Kind: train.Synthetic}},
		{"criteo:day_0", train.DataSpec{Kind: train.Criteo, Paths: []string{"day_0"}}},
		{"criteo:a.tsv, b.tsv", train.DataSpec{Kind: train.Criteo, Paths: []string{"a.tsv", "b.tsv"}}},
		{"libsvm:x.svm", train.DataSpec{Kind: train.LibSVM, Paths: []string{"x.svm"}}},
		{"movielens:../ml", train.DataSpec{Kind: train.MovieLens, Paths: []string{"../ml"}}},
		{"movielens:ml-100k/u1.base", train.DataSpec{Kind: train.MovieLens, Paths: []string{"ml-100k/u1.base"}}},
	} {
		got, err := train.ParseDataSpec(c.in)
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, got, c.in)
		again, err := train.ParseDataSpec(got.String())
		require.NoError(t, err)
		assert.Equal(t, got, again, "String round-trips %q", c.in)
	}
	for in, why := range map[string]string{
		"criteo":        "want synthetic",
		"parquet:x":     "unknown data kind",
		"criteo:":       "empty list",
		"criteo:a,,b":   "empty entry",
		"movielens:a,b": "one directory",
		"synthetic:x":   "takes no files",
		"libsvm: , ":    "empty entry",
	} {
		_, err := train.ParseDataSpec(in)
		require.Error(t, err, in)
		assert.ErrorIs(t, err, train.ErrDataSpec, in)
		assert.Contains(t, err.Error(), why, in)
	}
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, train.Config{CheckpointDir: "x"}.Validate())
	err := train.Config{
		Data: train.DataSpec{Kind: train.MovieLens}, TestFiles: []string{"t", "u"}, TestFraction: 1.5,
		Workers: -1, BatchSize: -3, BottomHidden: []int{0},
	}.Validate()
	require.ErrorIs(t, err, train.ErrConfig)
	for _, want := range []string{"needs at least one path", "movielens takes one held-out path", "TestFraction", "Workers", "BatchSize", "hidden layer", "CheckpointDir"} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = train.Run(context.Background(), train.Config{})
	assert.ErrorIs(t, err, train.ErrConfig, "Run validates")
}

func TestMissingData(t *testing.T) {
	for _, spec := range []string{"criteo:" + filepath.Join(t.TempDir(), "nope.tsv"), "movielens:" + filepath.Join(t.TempDir(), "nope")} {
		s, err := train.ParseDataSpec(spec)
		require.NoError(t, err)
		_, err = train.Run(context.Background(), train.Config{Data: s, CheckpointDir: t.TempDir()})
		require.Error(t, err, spec)
		assert.True(t, errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "no such file"), "%s: %v", spec, err)
	}
}

// TestScaleAtMovesServersWhileTraining grows the cluster to 3 servers and shrinks it to 2 while
// it trains; every position is trained exactly once, the summary reports both moves, and a
// resume from the final commit (taken after the moves) continues exactly once.
func TestScaleAtMovesServersWhileTraining(t *testing.T) {
	cfg := smallConfig(t, 400000, 1)
	cfg.CheckpointEvery = 200
	cfg.Duration = 2500 * time.Millisecond
	cfg.ScaleAt = []train.ScaleStep{{At: 300 * time.Millisecond, Servers: 3}, {At: 1200 * time.Millisecond, Servers: 2, Workers: 3}}
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Len(t, s.Repartitions, 2, "both moves made while training")
	for i, want := range [][2]int{{2, 3}, {3, 2}} {
		rp := s.Repartitions[i]
		assert.Equal(t, want, [2]int{rp.From, rp.To})
		assert.Positive(t, rp.SlotsTotal)
		assert.Equal(t, rp.SlotsTotal, rp.SlotsDone)
		assert.Empty(t, rp.Err)
	}
	assert.Equal(t, 2, s.Servers)
	assert.Equal(t, 3, s.Workers)
	assert.Contains(t, s.String(), "2 -> 3 parameter servers")
	require.Len(t, s.Epochs, 1)
	assert.True(t, s.Epochs[0].OK(), "%s", s.Epochs[0])
	assert.True(t, s.ExactlyOnce)
	assert.Equal(t, uint64(s.Steps), s.Checkpoints.LastCommitted)

	cfg.Resume, cfg.ScaleAt, cfg.Duration = true, nil, 500*time.Millisecond
	r, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	assert.Equal(t, uint64(s.Steps), r.ResumedStep)
	require.Len(t, r.Epochs, 1)
	assert.True(t, r.Epochs[0].OK(), "%s", r.Epochs[0])
	assert.Greater(t, r.TotalSamples, s.TotalSamples)
}

func TestParseScaleAt(t *testing.T) {
	got, err := train.ParseScaleAt("20s:ps=3; 1m:ps=2,workers=4;")
	require.NoError(t, err)
	assert.Equal(t, []train.ScaleStep{{At: 20 * time.Second, Servers: 3}, {At: time.Minute, Servers: 2, Workers: 4}}, got)
	for _, bad := range []string{"20s", "x:ps=3", "20s:ps=0", "20s:gpus=2", "20s:ps=three"} {
		_, err := train.ParseScaleAt(bad)
		assert.Error(t, err, bad)
	}
	cfg := smallConfig(t, 1000, 1)
	cfg.ScaleAt = []train.ScaleStep{{At: 2 * time.Second, Servers: 3}, {At: time.Second, Servers: 2}}
	assert.Error(t, cfg.Validate(), "steps out of order")
}

// A run too slow for its step schedule checkpoints by time: no step count is reached in three
// seconds, and every half second of training a checkpoint is taken; without the interval only
// the final one is.
func TestCheckpointsByTime(t *testing.T) {
	for _, interval := range []time.Duration{500 * time.Millisecond, -1} {
		t.Run(fmt.Sprint(interval), func(t *testing.T) {
			cfg := smallConfig(t, 1<<20, 1)
			cfg.CheckpointEvery, cfg.CheckpointInterval, cfg.Duration = 1<<30, interval, 3*time.Second
			s, err := train.Run(context.Background(), cfg)
			require.NoError(t, err)
			t.Logf("%d steps in %v: %d checkpoints taken", s.Steps, s.Elapsed, s.Checkpoints.Taken)
			assert.True(t, s.ExactlyOnce)
			if interval < 0 {
				assert.Equal(t, 1, s.Checkpoints.Taken, "only the final checkpoint")
				return
			}
			assert.GreaterOrEqual(t, s.Checkpoints.Taken, 2, "at least one by time before the final one")
			assert.Equal(t, uint64(s.Steps), s.Checkpoints.LastCommitted, "the final checkpoint holds the last step")
		})
	}
}

// A run with StatusAddr and MetricsAddr serves its status page and its metrics while it
// trains, says where in Note events, and stops serving when it returns. The metrics hold every
// part of the embedded job: the coordinator, each server and each worker, and the process.
func TestRunServesItsStatusPageAndMetrics(t *testing.T) {
	cfg := smallConfig(t, 6000, 1)
	cfg.StatusAddr, cfg.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0"
	var url, metricsURL string
	var snap statuspage.Snapshot
	var fetchErr, scrapeErr error
	var families map[string]*dto.MetricFamily
	commits, commitsThen := 0, 0
	cfg.OnEvent = func(ev train.Event) {
		if ev.Kind == train.EventNote && strings.HasPrefix(ev.Message, "status page at ") {
			url = strings.TrimPrefix(ev.Message, "status page at ")
		}
		if ev.Kind == train.EventNote && strings.HasPrefix(ev.Message, "metrics at ") {
			metricsURL = strings.TrimPrefix(ev.Message, "metrics at ")
		}
		if ev.Kind == train.EventCommit && ev.Checkpoint.Err == nil {
			commits++
		}
		if ev.Kind == train.EventCommit && url != "" && snap.Status.Job == "" {
			// The run waits while the page is read: it is read while the job trains.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			snap, fetchErr = statuspage.Fetch(ctx, url, nil)
			families, scrapeErr = scrape(metricsURL)
			commitsThen = commits
		}
	}
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.NotEmpty(t, url, "the run said where its page is")
	require.NoError(t, fetchErr)
	require.NoError(t, scrapeErr)
	assert.Equal(t, "dlrm", snap.Status.Job)
	nodes := func(name string) map[string]float64 {
		out := map[string]float64{}
		for _, m := range families[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" {
					out[l.GetValue()] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	samples := nodes("elasticps_worker_samples_total")
	assert.Len(t, samples, 2, "a series per worker: %v", samples)
	for w, n := range samples {
		assert.Positive(t, n, w)
	}
	requests := nodes("elasticps_server_requests_total")
	assert.Len(t, requests, 2, "a series per server: %v", requests)
	persist := families["elasticps_coordinator_checkpoint_persist_seconds"].GetMetric()
	require.Len(t, persist, 1)
	assert.Equal(t, uint64(commitsThen), persist[0].GetHistogram().GetSampleCount(), "every commit reported so far, the one being reported included")
	assert.Contains(t, families, "process_cpu_seconds_total")
	assert.Len(t, snap.Status.Servers, 2)
	require.NotEmpty(t, snap.Status.Owners, "the owner table, slot by slot")
	for _, id := range snap.Status.Owners {
		require.Contains(t, []string{"ps-0", "ps-1"}, id)
	}
	assert.True(t, s.ExactlyOnce)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = statuspage.Fetch(ctx, url, nil)
	assert.Error(t, err, "the page is gone with the run")
	_, err = scrape(metricsURL)
	assert.Error(t, err, "the metrics are gone with the run")
	assert.Positive(t, commits)
}

// scrape reads and parses the Prometheus exposition at url.
func scrape(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(pmodel.LegacyValidation)
	return p.TextToMetricFamilies(resp.Body)
}
