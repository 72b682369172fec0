package train_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// formatSynth is a single-valued synthetic data set (Criteo TSV has one id per column) with 4
// dense features and 6 fields that a small model learns within a few seconds.
var formatSynth = model.SynthConfig{
	DenseFeatures: 4,
	Vocab:         []int{5, 40, 200, 1000, 3000, 300},
	ZipfExponent:  1.2,
	Signal:        1.5,
}

// synthTestFrom is where the synthetic run's held-out records start (the train package's
// constant): the test files hold the same records, so every run is evaluated on the same set.
const synthTestFrom = 1 << 40

// writeFormats writes records [from, from+n) of g in three formats: Criteo TSV (the dense
// features as the integer counts they are the log of, the ids in hex), libFM (the dense
// features as fields of one feature weighted by the value, then one field per categorical
// field) and plain libSVM (every feature an index; the field map puts each dense feature and
// each categorical field's index range in its own field).
func writeFormats(t testing.TB, g *model.Synth, dir, name string, from, n uint64) (criteo, libfm, libsvm string) {
	t.Helper()
	sc := g.Config()
	nd, nf := sc.DenseFeatures, len(sc.Vocab)
	paths := [3]string{filepath.Join(dir, name+".tsv"), filepath.Join(dir, name+".ffm"), filepath.Join(dir, name+".svm")}
	var ws [3]*bufio.Writer
	for i, p := range paths {
		f, err := os.Create(p)
		require.NoError(t, err)
		defer func() { require.NoError(t, ws[i].Flush()); require.NoError(t, f.Close()) }()
		ws[i] = bufio.NewWriter(f)
	}
	var s model.Sample
	for i := from; i < from+n; i++ {
		g.Sample(i, &s)
		label := fmt.Sprint(s.Label)
		tsv, ffm := label, label
		svm := "-1" // the same labels as -1/+1
		if s.Label == 1 {
			svm = "+1"
		}
		for j := range 13 {
			tsv += "\t"
			if j < nd {
				tsv += fmt.Sprint(int64(math.Round(math.Expm1(float64(s.Dense[j]))))) // log(1+count) -> count
			}
		}
		for j, x := range s.Dense {
			ffm += fmt.Sprintf(" %d:0:%g", j, x)
			svm += fmt.Sprintf(" %d:%g", j, x)
		}
		for f := range 26 {
			tsv += "\t"
			if f < nf {
				tsv += fmt.Sprintf("%x", s.IDs[f])
			}
		}
		for f := range nf {
			ffm += fmt.Sprintf(" %d:%d:1", nd+f, s.IDs[f])
			// libSVM indices are small integers: each field its own range of a million.
			svm += fmt.Sprintf(" %d:1", (f+1)*1_000_000+int(s.IDs[f]%999_983))
		}
		for k, line := range [3]string{tsv, ffm, svm} {
			_, err := ws[k].WriteString(line + "\n")
			require.NoError(t, err)
		}
	}
	return paths[0], paths[1], paths[2]
}

// fieldMapOf is the libSVM field map of writeFormats.
func fieldMapOf(sc model.SynthConfig) string {
	var parts []string
	for j := range sc.DenseFeatures {
		parts = append(parts, fmt.Sprintf("d%d=%d", j, j))
	}
	for f := range sc.Vocab {
		parts = append(parts, fmt.Sprintf("c%d=%d-%d", f, (f+1)*1_000_000, (f+1)*1_000_000+999_999))
	}
	return strings.Join(parts, ",")
}

// TestFormatsTrainAlike writes the same generated records as Criteo TSV, libFM and libSVM with
// a field map, trains each (and the in-memory generator) with the same model and seed, and
// checks that they reach the same test AUC on the same held-out records within noise, well
// above what a model without working fields reaches.
func TestFormatsTrainAlike(t *testing.T) {
	records, tests, epochs := uint64(60000), uint64(8000), 2
	if raceEnabled {
		records, tests, epochs = 3000, 500, 1
	}
	sc := formatSynth
	sc.Seed = 11
	g, err := model.NewSynth(sc)
	require.NoError(t, err)
	dir := t.TempDir()
	tsv, ffm, svm := writeFormats(t, g, dir, "train", 0, records)
	ttsv, tffm, tsvm := writeFormats(t, g, dir, "test", synthTestFrom, tests)
	ceil, err := g.Ceiling(synthTestFrom, synthTestFrom+tests)
	require.NoError(t, err)

	run := func(t *testing.T, cfg train.Config) *train.Summary {
		t.Helper()
		cfg.Seed, cfg.Synth = sc.Seed, sc
		cfg.TestRecords, cfg.Epochs = int(tests), epochs
		cfg.EmbeddingDim, cfg.BottomHidden, cfg.TopHidden, cfg.BatchSize = 8, []int{16}, []int{32, 16}, 128
		cfg.ShardSize, cfg.CheckpointEvery, cfg.EvalEvery = 2048, -1, -1
		cfg.Workers, cfg.Servers = 1, 1 // one worker: the same updates in the same order every time
		cfg.CheckpointDir, cfg.ShmDir = t.TempDir(), t.TempDir()
		s, err := train.Run(context.Background(), cfg)
		require.NoError(t, err)
		require.True(t, s.ExactlyOnce)
		assert.Equal(t, int64(records)*int64(epochs), s.TotalSamples, "every line trained: none malformed, none held out")
		assert.Len(t, s.Notes, map[bool]int{true: 1, false: 0}[cfg.Data.Kind == train.LibSVM || cfg.Data.Kind == train.LibFM], "the fields are pointed out")
		assert.Zero(t, s.BadLines.Bad)
		assert.Equal(t, int(tests), s.Eval.Samples)
		return s
	}
	spec := func(kind, path string) train.DataSpec {
		d, err := train.ParseDataSpec(kind + ":" + path)
		require.NoError(t, err)
		return d
	}
	aucs := map[string]float64{}
	for _, c := range []struct {
		name string
		cfg  train.Config
	}{
		{"generator", train.Config{TrainRecords: int64(records)}},
		{"criteo", train.Config{Data: spec("criteo", tsv), TestFiles: []string{ttsv}}},
		{"libfm", train.Config{Data: spec("libfm", ffm), TestFiles: []string{tffm}}},
		{"libsvm", train.Config{Data: spec("libsvm", svm), TestFiles: []string{tsvm}, FieldMap: fieldMapOf(g.Config())}},
		{"onefield", train.Config{Data: spec("libsvm", svm), TestFiles: []string{tsvm}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := run(t, c.cfg)
			aucs[c.name] = s.Eval.AUC
			t.Logf("%s: test AUC %.4f, log loss %.4f (hidden model %.4f); %.0f samples/s", c.name, s.Eval.AUC, s.Eval.LogLoss, ceil.AUC, s.SamplesPerSec)
		})
	}
	if raceEnabled || t.Failed() {
		return // too few records under the race detector to compare figures
	}
	// With one worker every run is deterministic. The formats still differ from the generator
	// in what noise is made of: the generator visits the records of a shard shuffled, the files
	// are read in order, and Criteo's fixed 13 + 26 columns give the model 20 empty fields; so
	// "the same AUC" is within 0.025. A model of the fields reaches about 0.77 here; one that
	// pools every feature into one field, as plain libSVM without a field map must, stays near
	// 0.70, and so does one that drops the values of the dense features.
	for _, name := range []string{"criteo", "libfm", "libsvm"} {
		auc := aucs[name]
		assert.Greater(t, auc, 0.75, name)
		assert.Less(t, auc, ceil.AUC+0.01, "%s beats the hidden model", name)
		assert.InDelta(t, aucs["generator"], auc, 0.025, "%s against the in-memory generator", name)
	}
	assert.Less(t, aucs["onefield"], aucs["generator"]-0.05, "every libSVM feature in one field: a logistic regression in effect")
}
