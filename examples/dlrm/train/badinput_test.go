package train_test

import (
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// svmLines writes n libSVM lines; bad maps 1-based line numbers to the malformed line to write
// there instead.
func svmLines(t *testing.T, dir, name string, n int, bad map[int]string) string {
	t.Helper()
	var b strings.Builder
	// A feature of the file's own, so that no line of one file is a line of another (a test file
	// repeating training lines is refused).
	own := 1000 + crc32.ChecksumIEEE([]byte(name))%100_000
	for i := 1; i <= n; i++ {
		if l, ok := bad[i]; ok {
			b.WriteString(l + "\n")
			continue
		}
		fmt.Fprintf(&b, "%d %d:1 %d:0.5 %d:1\n", 2*(i%2)-1, i%7, 100+i%13, own) // -1/+1 labels
	}
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o600))
	return p
}

// textConfig is a quick run of a small model over text data.
func textConfig(t *testing.T, kind, path string, test ...string) train.Config {
	spec, err := train.ParseDataSpec(kind + ":" + path)
	require.NoError(t, err)
	return train.Config{Data: spec, TestFiles: test, Seed: 3, Epochs: 2, EvalEvery: -1, BatchSize: 32, ShardSize: 100,
		EmbeddingDim: 4, BottomHidden: []int{4}, TopHidden: []int{4}, Workers: 2, CheckpointEvery: -1,
		CheckpointDir: t.TempDir(), ShmDir: t.TempDir()}
}

// TestBadLinesCountedAndReported trains a file with a few malformed lines of every kind under
// the cap: the run succeeds, and the summary counts them once (two epochs), names each by file
// and line, and does not count them as trained samples.
func TestBadLinesCountedAndReported(t *testing.T) {
	dir := t.TempDir()
	bad := map[int]string{
		7:    "nan 1:1",        // NaN label
		120:  "+1",             // a label and no feature
		333:  "1 3:NaN",        // NaN value
		801:  "-1 3:inf 4:1",   // infinite value
		1999: "2 1:1",          // not a click label
		2000: "1 1:1 oops 2:1", // not idx:val
	}
	data := svmLines(t, dir, "train.svm", 2000, bad)
	test := svmLines(t, dir, "test.svm", 200, nil)
	cfg := textConfig(t, "libsvm", data, test)
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)

	require.Len(t, s.BadLines.Files, 2)
	assert.Equal(t, shard.FileBadLines{File: data, Lines: 2000, Bad: 6}, s.BadLines.Files[0], "each bad line once over two epochs, named by its path")
	assert.Equal(t, shard.FileBadLines{File: test, Lines: 200}, s.BadLines.Files[1])
	require.Len(t, s.BadLines.Examples, 5, "the first five kept")
	for _, e := range s.BadLines.Examples {
		assert.Equal(t, data, e.File)
		assert.Contains(t, bad, int(e.Line), "a 1-based line number of a bad line: %v", e)
	}
	assert.NoError(t, s.BadLines.Err)
	assert.Equal(t, int64(2*(2000-6)), s.TotalSamples, "every good line trained once per epoch, no bad one")
	assert.True(t, s.ExactlyOnce)
	for _, e := range s.Epochs {
		assert.Equal(t, int64(2000), e.Covered, "bad lines are positions covered without training")
	}
	text := s.String()
	for _, want := range []string{
		"6 malformed lines skipped, not trained (" + data + ": 6 of 2000 lines)",
		data + ":7: label \"nan\"",
		data + ":120: a label and no feature",
		"4000 positions covered, 3988 of them trained as samples",
		"every libSVM feature lands in one field",
	} {
		assert.Contains(t, text, want)
	}
	assert.NotContains(t, text, "positions trained", "positions are covered; samples are trained")
}

// TestBadInputStopsTheRun checks every way bad input ends a run with an error that names the
// file and line, a non-zero exit in the command, and no evaluation.
func TestBadInputStopsTheRun(t *testing.T) {
	t.Run("more than 1 % of the lines", func(t *testing.T) {
		dir := t.TempDir()
		bad := map[int]string{}
		for l := 1500; l < 1530; l++ { // 30 of 2000: 1.5 %, all late in the file
			bad[l] = "1 1:nan"
		}
		data := svmLines(t, dir, "train.svm", 2000, bad)
		cfg := textConfig(t, "libsvm", data, svmLines(t, dir, "test.svm", 200, nil))
		s, err := train.Run(context.Background(), cfg)
		require.ErrorIs(t, err, shard.ErrTooManyBadLines)
		assert.Contains(t, err.Error(), data+": more than 1% of its lines are malformed")
		assert.Contains(t, err.Error(), data+":15") // the first bad lines, by line
		require.NotNil(t, s)
		assert.Equal(t, "too many malformed lines", s.StopReason)
		assert.Zero(t, s.Eval.Samples, "no AUC for a run the input stopped")
		assert.Contains(t, s.String(), "STOPPED: "+data)
		assert.Contains(t, s.String(), "test:        not evaluated")

		cfg.MaxBadFraction, cfg.CheckpointDir = 0.02, t.TempDir()
		s, err = train.Run(context.Background(), cfg)
		require.NoError(t, err, "2 % allowed")
		assert.Equal(t, int64(30), s.BadLines.Bad)
	})
	t.Run("fail on the first", func(t *testing.T) {
		dir := t.TempDir()
		data := svmLines(t, dir, "train.svm", 2000, map[int]string{1234: "1 1:1 2:inf"})
		cfg := textConfig(t, "libsvm", data, svmLines(t, dir, "test.svm", 200, nil))
		cfg.BadLines = train.FailOnBadLine
		_, err := train.Run(context.Background(), cfg)
		require.ErrorIs(t, err, shard.ErrTooManyBadLines)
		assert.Contains(t, err.Error(), data+":1234: feature 2 value \"inf\"")
	})
	t.Run("a test file of bad lines", func(t *testing.T) {
		dir := t.TempDir()
		bad := map[int]string{}
		for l := 1; l <= 200; l++ {
			bad[l] = "1\t2\t3"
		}
		test := svmLines(t, dir, "test.svm", 200, bad)
		_, err := train.Run(context.Background(), textConfig(t, "libsvm", svmLines(t, dir, "train.svm", 500, nil), test))
		require.ErrorIs(t, err, shard.ErrTooManyBadLines)
		assert.Contains(t, err.Error(), test+":1: feature \"2\" is not idx:val")
	})
	t.Run("a comma-separated file given as criteo", func(t *testing.T) {
		var b strings.Builder
		for i := range 5000 {
			fmt.Fprintf(&b, "%d,%d,%d,68fd1e64\n", i%2, i, 3*i)
		}
		data := filepath.Join(t.TempDir(), "train.csv")
		require.NoError(t, os.WriteFile(data, []byte(b.String()), 0o600))
		s, err := train.Run(context.Background(), textConfig(t, "criteo", data))
		require.ErrorIs(t, err, shard.ErrTooManyBadLines)
		assert.Nil(t, s, "stopped while loading, before any training")
		assert.Contains(t, err.Error(), data+":1: no tab but commas")
	})
	t.Run("nothing trained", func(t *testing.T) {
		dir := t.TempDir()
		bad := map[int]string{}
		for l := 1; l <= 300; l++ {
			bad[l] = "1"
		}
		cfg := textConfig(t, "libsvm", svmLines(t, dir, "train.svm", 300, bad), svmLines(t, dir, "test.svm", 100, nil))
		cfg.MaxBadFraction = 1 // let every bad line through: then no sample is left to train
		s, err := train.Run(context.Background(), cfg)
		require.ErrorIs(t, err, train.ErrNothingTrained)
		require.NotNil(t, s)
		assert.Zero(t, s.Eval.Samples, "no AUC of an untrained model")
		assert.Contains(t, err.Error(), "a label and no feature")

		empty := filepath.Join(dir, "empty.svm")
		require.NoError(t, os.WriteFile(empty, nil, 0o600))
		_, err = train.Run(context.Background(), textConfig(t, "libsvm", empty))
		assert.ErrorIs(t, err, train.ErrNothingTrained)
	})
}

// TestMovieLens100KWithTestFile trains a MovieLens directory in the 100K layout (u.data, u.item)
// and evaluates its own held-out ratings file (u1.test), joined with the training set's movies.
func TestMovieLens100KWithTestFile(t *testing.T) {
	dir := writeMovieLens100K(t)
	// The directory's u.data without the ratings of u1.test: u1.base.
	base, err := os.ReadFile(filepath.Join(dir, "u1.base"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "u.data"), base, 0o600))
	cfg := textConfig(t, "movielens", dir, filepath.Join(dir, "u1.test"))
	cfg.Epochs, cfg.BatchSize, cfg.EmbeddingDim, cfg.Workers = 3, 64, 8, 1 // one worker: the same AUC every run
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	assert.Equal(t, 600, s.Eval.Samples, "every rating of u1.test evaluated")
	assert.Equal(t, int64(3*5400), s.TotalSamples, "every rating of u.data trained, none held out of it")
	assert.Contains(t, s.HeldOut, "u1.test")
	assert.Contains(t, s.Data, "50 movies")
	assert.Greater(t, s.Eval.AUC, 0.9, "user and movie parity is easy to learn")
}
