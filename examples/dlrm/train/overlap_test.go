package train_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeMovieLens100K writes a MovieLens directory in the 100K layout: u.item with 50 movies,
// u.data with 6000 ratings, and the split u1.base and u1.test of u.data (every tenth rating to
// the test, from the first), as the real ml-100k has them.
func writeMovieLens100K(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var item, data, base, test strings.Builder
	for m := 1; m <= 50; m++ {
		flags := make([]string, 19)
		for g := range flags {
			flags[g] = fmt.Sprint((m + g) % 5 / 4)
		}
		fmt.Fprintf(&item, "%d|Movie %d (19%02d)|01-Jan-1995||http://x|%s\n", m, m, 50+m%40, strings.Join(flags, "|"))
	}
	// A user likes a movie when both are even or both odd: learnable from the ids.
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 6000 {
		u, m := 1+r.IntN(97), 1+r.IntN(50)
		rating := 2
		if u%2 == m%2 {
			rating = 5
		}
		line := fmt.Sprintf("%d\t%d\t%d\t%d\n", u, m, rating, 881250949+i)
		data.WriteString(line)
		if i%10 == 0 {
			test.WriteString(line)
		} else {
			base.WriteString(line)
		}
	}
	for name, b := range map[string]string{"u.item": item.String(), "u.data": data.String(), "u1.base": base.String(), "u1.test": test.String()} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(b), 0o600))
	}
	return dir
}

// TestMovieLens100KSplitFiles trains the 100K layout's u1.base and evaluates u1.test: no overlap.
// Training the whole directory (u.data, which holds every rating of u1.test) is refused, naming
// the count and the first pairs by file and line, unless AllowOverlap is set; then the summary
// gives the count.
func TestMovieLens100KSplitFiles(t *testing.T) {
	dir := writeMovieLens100K(t)
	test := filepath.Join(dir, "u1.test")

	cfg := textConfig(t, "movielens", dir, test)
	_, err := train.Run(context.Background(), cfg)
	require.ErrorIs(t, err, train.ErrOverlap)
	var oe *train.OverlapError
	require.True(t, errors.As(err, &oe))
	data := filepath.Join(dir, "u.data")
	assert.Equal(t, 600, oe.Overlap.Records)
	assert.Equal(t, 600, oe.Overlap.Of)
	assert.False(t, oe.Overlap.Split)
	require.NotEmpty(t, oe.Overlap.Examples)
	assert.Equal(t, train.OverlapPair{Test: test + ":1", Train: data + ":1"}, oe.Overlap.Examples[0])
	assert.Equal(t, train.OverlapPair{Test: test + ":2", Train: data + ":11"}, oe.Overlap.Examples[1])
	assert.Contains(t, err.Error(), "600 of 600 test records also in the training data, e.g. "+test+":1 = "+data+":1, "+test+":2 = "+data+":11")
	assert.Contains(t, err.Error(), "-allow-overlap")

	cfg = textConfig(t, "movielens", filepath.Join(dir, "u1.base"), test)
	cfg.Epochs, cfg.BatchSize, cfg.EmbeddingDim, cfg.Workers = 3, 64, 8, 1
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.NotNil(t, s.Overlap)
	assert.Equal(t, 0, s.Overlap.Records, "u1.base and u1.test are disjoint")
	assert.Equal(t, 600, s.Overlap.Of)
	assert.Equal(t, int64(3*5400), s.TotalSamples, "every rating of u1.base trained")
	assert.Equal(t, 600, s.Eval.Samples)
	assert.Contains(t, s.Data, "u1.base")
	assert.Contains(t, s.Data, "50 movies", "the movies of u.item, beside u1.base")
	assert.NotContains(t, s.String(), "overlap:")
	assert.Greater(t, s.Eval.AUC, 0.9, "user and movie parity is easy to learn")

	cfg = textConfig(t, "movielens", dir, test)
	cfg.Epochs, cfg.AllowOverlap = 1, true
	s, err = train.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.NotNil(t, s.Overlap)
	assert.Equal(t, 600, s.Overlap.Records)
	assert.Contains(t, s.String(), "overlap:     600 of 600 test records also in the training data, e.g. "+test+":1 = "+data+":1")
}

// TestOverlapEveryTextFormat gives each text format its own training file as the test file
// (refused, every record in both, the same line on each side), and a test file of 300 records of
// their own with 7 training lines among them (refused with exactly those 7: no false positive).
func TestOverlapEveryTextFormat(t *testing.T) {
	sc := formatSynth
	sc.Seed = 12
	g, err := model.NewSynth(sc)
	require.NoError(t, err)
	dir := t.TempDir()
	tsv, ffm, svm := writeFormats(t, g, dir, "train", 0, 2000)
	ttsv, tffm, tsvm := writeFormats(t, g, dir, "test", synthTestFrom, 300)
	copied := []int{4, 100, 101, 999, 1500, 1998, 2000} // lines of the training file
	for _, c := range []struct{ kind, data, test string }{{"criteo", tsv, ttsv}, {"libfm", ffm, tffm}, {"libsvm", svm, tsvm}} {
		t.Run(c.kind, func(t *testing.T) {
			cfg := textConfig(t, c.kind, c.data, c.data)
			_, err := train.Run(context.Background(), cfg)
			var oe *train.OverlapError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, 2000, oe.Overlap.Records)
			assert.Equal(t, 2000, oe.Overlap.Of)
			assert.Equal(t, train.OverlapPair{Test: c.data + ":1", Train: c.data + ":1"}, oe.Overlap.Examples[0])
			assert.Contains(t, err.Error(), "2000 of 2000 test records also in the training data, e.g. "+c.data+":1 = "+c.data+":1, "+c.data+":2 = "+c.data+":2")

			trainLines := readLines(t, c.data)
			mixed := readLines(t, c.test)
			for _, l := range copied {
				mixed = append(mixed, trainLines[l-1])
			}
			mixedPath := filepath.Join(t.TempDir(), "mixed"+filepath.Ext(c.test))
			require.NoError(t, os.WriteFile(mixedPath, []byte(strings.Join(mixed, "\n")+"\n"), 0o600))
			cfg = textConfig(t, c.kind, c.data, mixedPath)
			_, err = train.Run(context.Background(), cfg)
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, len(copied), oe.Overlap.Records, "only the copied lines")
			assert.Equal(t, 307, oe.Overlap.Of)
			assert.Equal(t, train.OverlapPair{Test: mixedPath + ":301", Train: c.data + ":4"}, oe.Overlap.Examples[0])
			assert.Equal(t, train.OverlapPair{Test: mixedPath + ":305", Train: c.data + ":1500"}, oe.Overlap.Examples[4])
			assert.Len(t, oe.Overlap.Examples, 5)
			assert.Contains(t, err.Error(), ", ...: ")
		})
	}
}

// TestOverlapRandomSplitCounted trains libSVM data that holds each line twice, split at random:
// the duplicates that fall on both sides are counted in the summary, and the run is not refused.
func TestOverlapRandomSplitCounted(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := range 1000 {
		line := fmt.Sprintf("%d %d:1 %d:1\n", i%2, 1+i%37, 100+i)
		b.WriteString(line + line)
	}
	path := filepath.Join(dir, "dup.svm")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	cfg := textConfig(t, "libsvm", path)
	cfg.Epochs = 1
	s, err := train.Run(context.Background(), cfg)
	require.NoError(t, err)
	require.NotNil(t, s.Overlap)
	assert.True(t, s.Overlap.Split)
	// A pair lands on both sides with probability 2 * 0.2 * 0.8 = 0.32: about 320 of the 400
	// held-out records.
	assert.InDelta(t, 320, s.Overlap.Records, 60)
	assert.InDelta(t, 400, s.Overlap.Of, 60)
	assert.Contains(t, s.String(), "held-out records duplicate a training record")
}

// readLines returns the lines of a file, without their newlines.
func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}
