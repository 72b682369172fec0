package train_test

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// libsvmLines writes n libSVM lines whose label follows their features, with some noise, so a
// small model learns an AUC well away from 0.5 and 1; a seed other than 0 (held-out data) gives
// each line a feature of its own, so that no line is one of the training data.
func libsvmLines(b *strings.Builder, n, seed int) {
	for i := range n {
		a, c, d := (i*7+seed)%11, (i*13+seed)%17, (i*5+seed)%3
		y := 0
		if a+c/2 > 9 {
			y = 1
		}
		if (i*31+seed)%10 == 0 { // noise
			y = 1 - y
		}
		if seed == 0 {
			fmt.Fprintf(b, "%d %d:1 %d:1 %d:0.5\n", y, a, 100+c, 200+d)
			continue
		}
		// A line of held-out data has a feature of its own, so that it is no training line.
		fmt.Fprintf(b, "%d %d:1 %d:1 %d:0.5 %d:1\n", y, a, 100+c, 200+d, 1000+i)
	}
}

// prediction is one line of a predictions file.
type prediction struct {
	at    string
	label float64
	score float64
}

// readPredictions reads a predictions file: its header's first column and its lines.
func readPredictions(t *testing.T, path string) (string, []prediction) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	require.True(t, sc.Scan(), "a header line")
	head := strings.Split(sc.Text(), "\t")
	require.Len(t, head, 3, "header %q", sc.Text())
	require.Equal(t, []string{"label", "score"}, head[1:])
	var out []prediction
	for sc.Scan() {
		cols := strings.Split(sc.Text(), "\t")
		require.Len(t, cols, 3, "line %q", sc.Text())
		y, err := strconv.ParseFloat(cols[1], 64)
		require.NoError(t, err)
		s, err := strconv.ParseFloat(cols[2], 64)
		require.NoError(t, err)
		out = append(out, prediction{at: cols[0], label: y, score: s})
	}
	require.NoError(t, sc.Err())
	return head[0], out
}

// rankAUC is the AUC of scores by the rank-sum (Mann-Whitney) formula, ties given their mean
// rank: written here apart from the trainer's own.
func rankAUC(t *testing.T, ps []prediction) float64 {
	t.Helper()
	s := slices.Clone(ps)
	slices.SortFunc(s, func(a, b prediction) int {
		switch {
		case a.score < b.score:
			return -1
		case a.score > b.score:
			return 1
		}
		return 0
	})
	var rankSum float64
	var pos, neg int
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && s[j].score == s[i].score {
			j++
		}
		mean := float64(i+1+j) / 2 // ranks i+1 .. j
		for k := i; k < j; k++ {
			require.True(t, s[k].label == 0 || s[k].label == 1, "label %v", s[k].label)
			if s[k].label == 1 {
				rankSum += mean
				pos++
			} else {
				neg++
			}
		}
		i = j
	}
	require.Positive(t, pos)
	require.Positive(t, neg)
	return (rankSum - float64(pos)*float64(pos+1)/2) / (float64(pos) * float64(neg))
}

// TestPredictionsFileGivesTheSummarysAUC trains text data with a test file (one malformed line
// in it) and -predictions: the file has one line per evaluated test record, each naming its own
// file:line (whose label it carries), and the AUC recomputed from the file is the summary's.
// Then it evaluates the final commit with a predictions file of its own: the same scores.
func TestPredictionsFileGivesTheSummarysAUC(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	libsvmLines(&b, 2000, 0)
	trainPath := filepath.Join(dir, "train.svm")
	require.NoError(t, os.WriteFile(trainPath, []byte(b.String()), 0o600))
	b.Reset()
	libsvmLines(&b, 400, 3)
	lines := strings.SplitAfter(b.String(), "\n")
	lines = slices.Insert(lines, 4, "not a line of libsvm\n") // line 5 is malformed, skipped
	testPath := filepath.Join(dir, "test.svm")
	require.NoError(t, os.WriteFile(testPath, []byte(strings.Join(lines, "")), 0o600))
	lines = strings.Split(strings.Join(lines, ""), "\n")

	spec, err := train.ParseDataSpec("libsvm:" + trainPath)
	require.NoError(t, err)
	out := filepath.Join(dir, "predictions.tsv")
	cfg := train.Config{Data: spec, TestFiles: []string{testPath}, Seed: 1, Epochs: 2, EvalEvery: -1, BatchSize: 32,
		ShardSize: 256, EmbeddingDim: 4, BottomHidden: []int{4}, TopHidden: []int{8}, CheckpointEvery: -1,
		CheckpointDir: t.TempDir(), ShmDir: t.TempDir(), Predictions: out}
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Equal(t, "every epoch done", s.StopReason, "file data without a Duration runs every epoch")
	require.Equal(t, 400, s.Eval.Samples)
	assert.Equal(t, out, s.Predictions)
	assert.Contains(t, s.String(), "predictions: "+out)

	column, ps := readPredictions(t, out)
	assert.Equal(t, "file:line", column)
	require.Equal(t, s.Eval.Samples, len(ps), "one line per test record")
	seen := map[int]bool{}
	for _, p := range ps {
		file, no, ok := strings.Cut(p.at, ":")
		require.True(t, ok, "%q", p.at)
		require.Equal(t, testPath, file)
		n, err := strconv.Atoi(no)
		require.NoError(t, err)
		require.False(t, seen[n], "line %d twice", n)
		seen[n] = true
		assert.Equal(t, lines[n-1][:1], strconv.FormatFloat(p.label, 'g', -1, 64), "%s: the label of its own line", p.at)
	}
	for n := 1; n <= 401; n++ {
		assert.Equal(t, n != 5, seen[n], "line %d: every well-formed test line once, the malformed one not", n)
	}
	auc := rankAUC(t, ps)
	t.Logf("AUC recomputed from the file %.12f, summary %.12f", auc, s.Eval.AUC)
	assert.InDelta(t, s.Eval.AUC, auc, 1e-9)
	assert.Greater(t, auc, 0.6, "the model learned something")
	var ll float64
	for _, p := range ps {
		q := min(max(p.score, 1e-7), 1-1e-7)
		ll -= p.label*math.Log(q) + (1-p.label)*math.Log(1-q)
	}
	assert.InDelta(t, s.Eval.LogLoss, ll/float64(len(ps)), 1e-4)

	// The commit evaluated alone scores the same records alike.
	cfg.Evaluate, cfg.Predictions = "newest", filepath.Join(dir, "again.tsv")
	e, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	_, again := readPredictions(t, cfg.Predictions)
	assert.Equal(t, s.Eval.AUC, e.Eval.AUC)
	assert.InDelta(t, e.Eval.AUC, rankAUC(t, again), 1e-9)
	assert.Equal(t, cfg.Predictions, e.Predictions)
}

// TestPredictionsOfSyntheticData: generated test records are named by the generator's index;
// with keep-best the file holds the evaluation the test line reports, the best commit's.
func TestPredictionsOfSyntheticData(t *testing.T) {
	for _, keepBest := range []bool{false, true} {
		cfg := smallConfig(t, 4000, 1)
		cfg.TestRecords, cfg.KeepBest = 1500, train.SwitchOff
		if keepBest {
			cfg.KeepBest = train.SwitchOn
		}
		cfg.Predictions = filepath.Join(t.TempDir(), "p.tsv")
		s, err := train.Run(context.Background(), cfg)
		require.NoError(t, err)
		column, ps := readPredictions(t, cfg.Predictions)
		assert.Equal(t, "record", column)
		require.Equal(t, 1500, len(ps), "one line per test record")
		for i, p := range ps {
			require.Equal(t, strconv.FormatInt(1<<40+int64(i), 10), p.at)
		}
		auc := rankAUC(t, ps)
		t.Logf("keep-best %v: AUC recomputed from the file %.12f, summary %.12f", keepBest, auc, s.Test().AUC)
		assert.InDelta(t, s.Test().AUC, auc, 1e-9)
		if keepBest {
			require.NotNil(t, s.Best)
			if s.BestTest != nil {
				assert.InDelta(t, s.BestTest.AUC, auc, 1e-9, "the best commit's")
			}
		} else {
			assert.InDelta(t, s.Eval.AUC, auc, 1e-9)
		}
	}
}

// TestSoftLabelInATestFileIsRefused: AUC is defined on clicks, so a test line with a soft label
// stops the run before training, named by its file and line.
func TestSoftLabelInATestFileIsRefused(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	libsvmLines(&b, 200, 0)
	trainPath := filepath.Join(dir, "train.svm")
	require.NoError(t, os.WriteFile(trainPath, []byte("0.3 1:1 2:1\n"+b.String()), 0o600)) // trained: fine
	testPath := filepath.Join(dir, "test.svm")
	require.NoError(t, os.WriteFile(testPath, []byte("1 1:1\n-1 2:1\n0.7 3:1\n+1 4:1\n"), 0o600))
	spec, err := train.ParseDataSpec("libsvm:" + trainPath)
	require.NoError(t, err)
	cfg := train.Config{Data: spec, TestFiles: []string{testPath}, EvalEvery: -1, CheckpointDir: t.TempDir(), ShmDir: t.TempDir()}
	_, err = train.Run(context.Background(), cfg)
	require.ErrorIs(t, err, train.ErrSoftLabel)
	assert.Contains(t, err.Error(), testPath+":3: label 0.7")
}

// TestDurationCutShortSaysSo: a run Duration ends says how far its epochs got.
func TestDurationCutShortSaysSo(t *testing.T) {
	const records = 50_000_000 // far more than a second trains
	cfg := smallConfig(t, records, 2)
	cfg.Duration, cfg.CheckpointEvery, cfg.TestRecords = time.Second, -1, 2000
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	m := regexp.MustCompile(`^stopped by -duration after (\d+) of (\d+) samples`).FindStringSubmatch(s.StopReason)
	require.NotNil(t, m, "stop reason %q", s.StopReason)
	t.Log(s.StopReason)
	n, _ := strconv.ParseInt(m[1], 10, 64)
	total, _ := strconv.ParseInt(m[2], 10, 64)
	assert.Equal(t, int64(2*records), total)
	assert.Equal(t, s.TotalSamples, n)
	assert.Positive(t, n)
	assert.Less(t, n, total)
	assert.Contains(t, s.String(), "summary (stopped by -duration after ")
}
