package train

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// day0 is 2001-01-01T00:00:00Z.
const day0 = 978307200

// tinyMovieLens writes a MovieLens directory: user 1 rates movies 1 and 2 on one day and movie 3
// on the next, user 2 rates movie 1 three times on a third day; movie 4 is rated once, by user 3.
func tinyMovieLens(t *testing.T) string {
	dir := t.TempDir()
	movies := "movieId,title,genres\n1,A (1995),Comedy\n2,B (1996),Drama|Comedy\n3,C (1997),Drama\n4,D (1998),Horror\n"
	ratings := "userId,movieId,rating,timestamp\n"
	for _, r := range []struct {
		user, movie int
		ts          int64
	}{
		{1, 1, day0 + 3600}, {1, 2, day0 + 7200}, {1, 3, day0 + 86400 + 60},
		{2, 1, day0 + 2*86400 + 10}, {2, 1, day0 + 2*86400 + 20}, {2, 1, day0 + 2*86400 + 30},
		{3, 4, day0 + 3*86400},
	} {
		ratings += strconv.Itoa(r.user) + "," + strconv.Itoa(r.movie) + ",4.0," + strconv.FormatInt(r.ts, 10) + "\n"
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "movies.csv"), []byte(movies), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ratings.csv"), []byte(ratings), 0o644))
	return dir
}

// TestMovieLensFeatures: the user_day field is one id per user and UTC day, and the ids seen
// fewer than MinCount times among the training ratings, and only those, become their field's
// rare id, in training and held-out records alike.
func TestMovieLensFeatures(t *testing.T) {
	ml, err := shard.LoadMovieLens(os.DirFS(tinyMovieLens(t)), shard.MovieLensConfig{})
	require.NoError(t, err)
	require.EqualValues(t, 7, ml.Len())
	cfg := Config{Data: DataSpec{Kind: MovieLens, Paths: []string{"x"}}, MinCount: 1}
	cfg.fill()
	require.Equal(t, []string{"user", "movie", "genres", "year", userDayField}, movieLensFields(&cfg))

	f, err := newMovieLensFeatures(&cfg, ml, []int{0, 1, 2, 3, 4, 5, 6})
	require.NoError(t, err)
	recs := make([]shard.Record, ml.Len())
	for i := range recs {
		require.NoError(t, f.read(ml, i, &recs[i]))
		require.Equal(t, 5, recs[i].NumFields())
	}
	day := func(i int) uint64 { return recs[i].Field(4)[0] }
	assert.Equal(t, day(0), day(1), "one user, one day")
	assert.NotEqual(t, day(0), day(2), "the next day")
	assert.Equal(t, day(3), day(5))
	assert.NotEqual(t, day(0), day(3), "another user")

	// Counted on ratings 0-5 only (rating 6, of movie 4 by user 3, is held out): with
	// MinCount 2, movie 1 (four ratings) keeps its id, movie 2 (one) becomes the rare id, and so
	// does every id of the held-out rating; user 2's day (three ratings) keeps its id, user 1's
	// second day (one) does not.
	cfg.MinCount = 2
	f, err = newMovieLensFeatures(&cfg, ml, []int{0, 1, 2, 3, 4, 5})
	require.NoError(t, err)
	var rec shard.Record
	require.NoError(t, f.read(ml, 0, &rec))
	assert.Equal(t, recs[0].Field(shard.MovieLensFieldMovie), rec.Field(shard.MovieLensFieldMovie), "movie 1")
	assert.Equal(t, recs[0].Field(4), rec.Field(4), "user 1's first day: two ratings")
	require.NoError(t, f.read(ml, 1, &rec))
	assert.Equal(t, []uint64{rareID}, rec.Field(shard.MovieLensFieldMovie), "movie 2")
	assert.Equal(t, recs[1].Field(shard.MovieLensFieldGenre), rec.Field(shard.MovieLensFieldGenre), "drama and comedy: seen twice each")
	require.NoError(t, f.read(ml, 2, &rec))
	assert.Equal(t, []uint64{rareID}, rec.Field(4), "user 1's second day")
	require.NoError(t, f.read(ml, 4, &rec))
	assert.Equal(t, recs[4].Field(4), rec.Field(4), "user 2's day")
	require.NoError(t, f.read(ml, 6, &rec))
	for fi := range rec.NumFields() { // horror and 1998 too: only the held-out rating has them
		assert.Equal(t, []uint64{rareID}, rec.Field(fi), "field %d of the held-out rating", fi)
	}

	// Without user_day the reader's fields stay as they are.
	cfg.UserDay, cfg.MinCount = SwitchOff, 1
	f, err = newMovieLensFeatures(&cfg, ml, nil)
	require.NoError(t, err)
	require.NoError(t, f.read(ml, 6, &rec))
	assert.Equal(t, 4, rec.NumFields())
	assert.Equal(t, []string{"user", "movie", "genres", "year"}, movieLensFields(&cfg))
}

// TestMovieLensOnlySettings: the frequency threshold and user_day are MovieLens settings, the
// defaults (and that of concatenated embeddings) are on for MovieLens only, and a threshold below
// 1 is refused.
func TestMovieLensOnlySettings(t *testing.T) {
	ml := Config{Data: DataSpec{Kind: MovieLens, Paths: []string{"x"}}}
	ml.fill()
	assert.Equal(t, DefaultMovieLensMinCount, ml.MinCount)
	assert.Equal(t, SwitchOn, ml.UserDay)
	assert.Equal(t, SwitchOn, ml.ConcatEmbeddings)
	synth := Config{}
	synth.fill()
	assert.Equal(t, 1, synth.MinCount)
	assert.Equal(t, SwitchOff, synth.UserDay)
	assert.Equal(t, SwitchOff, synth.ConcatEmbeddings)
	assert.False(t, synth.firstOrder())

	for _, c := range []Config{
		{MinCount: 5, CheckpointDir: "d"},
		{UserDay: SwitchOn, CheckpointDir: "d"},
		{Data: DataSpec{Kind: MovieLens, Paths: []string{"x"}}, MinCount: -1, CheckpointDir: "d"},
	} {
		assert.ErrorIs(t, c.Validate(), ErrConfig, "%+v", c)
	}
	ok := Config{Data: DataSpec{Kind: MovieLens, Paths: []string{"x"}}, MinCount: 3, UserDay: SwitchOff, FirstOrder: SwitchOn, CheckpointDir: "d"}
	assert.NoError(t, ok.Validate())
}
