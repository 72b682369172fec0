package shard_test

import (
	"context"
	"errors"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/elasticps/elasticps/shard"
)

// movieLensDir is the MovieLens ml-latest-small copy shared by the project (GroupLens licence:
// research use, no redistribution outside its terms; see its README.txt).
const movieLensDir = "../../shared/data/movielens-latest-small"

// requireMovieLens skips the test when the shared data directory is not there, and fails it
// under CI (CI=true), so that a missing data path never turns the MovieLens tests off there.
func requireMovieLens(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(movieLensDir + "/ratings.csv"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("MovieLens data not found at %s, and CI must run the MovieLens tests: %v", movieLensDir, err)
		}
		t.Skipf("MovieLens data not found at %s (shared data directory absent): %v", movieLensDir, err)
	}
}

const smallMovies = `movieId,title,genres
1,Toy Story (1995),Adventure|Animation|Children|Comedy|Fantasy
2,"American President, The (1995)",Comedy|Drama|Romance
3,Untitled,(no genres listed)
`

func TestMovieLensSmall(t *testing.T) {
	fsys := fstest.MapFS{
		"movies.csv":  {Data: []byte(smallMovies)},
		"ratings.csv": {Data: []byte("userId,movieId,rating,timestamp\n1,1,4.0,964982703\n2,2,3.5,1445714994\r\n7,3,5,0\n")},
	}
	ml, err := shard.LoadMovieLens(fsys, shard.MovieLensConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if ml.Len() != 3 || ml.Movies().Len() != 3 {
		t.Fatalf("len %d movies %d", ml.Len(), ml.Movies().Len())
	}
	var rec shard.Record
	if err := ml.ReadRecord(0, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Label != 1 || len(rec.Dense) != shard.MovieLensDense || rec.NumFields() != 4 {
		t.Fatalf("%+v", rec)
	}
	if rec.Field(shard.MovieLensFieldUser)[0] != shard.FeatureIDInt(shard.MovieLensFieldUser, 1) ||
		rec.Field(shard.MovieLensFieldMovie)[0] != shard.FeatureIDInt(shard.MovieLensFieldMovie, 1) ||
		len(rec.Field(shard.MovieLensFieldGenre)) != 5 ||
		rec.Field(shard.MovieLensFieldGenre)[1] != shard.FeatureIDString(shard.MovieLensFieldGenre, "Animation") ||
		rec.Field(shard.MovieLensFieldYear)[0] != shard.FeatureIDInt(shard.MovieLensFieldYear, 1995) {
		t.Fatalf("ids %v ends %v", rec.IDs, rec.FieldEnds)
	}
	// 964982703 is 2000-07-30T18:45:03Z, a Sunday; the movie was five years old.
	hour := 2 * math.Pi * (18*3600 + 45*60 + 3) / 86400.0
	want := []float64{(964982703 - 788918400) / (365.25 * 86400) / 25, math.Sin(hour), math.Cos(hour), 0, 1, math.Log1p(5)}
	for i, w := range want {
		if math.Abs(float64(rec.Dense[i])-w) > 1e-5 {
			t.Fatalf("dense[%d] = %v, want %v", i, rec.Dense[i], w)
		}
	}
	if err := ml.ReadRecord(1, &rec); err != nil || rec.Label != 0 || len(rec.Field(shard.MovieLensFieldGenre)) != 3 {
		t.Fatalf("quoted title row: %v %+v", err, rec)
	}
	if err := ml.ReadRecord(2, &rec); err != nil || len(rec.Field(shard.MovieLensFieldGenre)) != 0 || len(rec.Field(shard.MovieLensFieldYear)) != 0 || rec.Dense[5] != 0 {
		t.Fatalf("no genres, no year: %v %+v", err, rec)
	}
	if err := ml.ReadRecord(3, &rec); err == nil {
		t.Fatal("out of range read")
	}
}

func TestMovieLensMalformed(t *testing.T) {
	ratings := "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,99,4.0,1\nbad line\n1,2,x,3\n2,2,1,5\n"
	fsys := fstest.MapFS{"movies.csv": {Data: []byte(smallMovies)}, "r.csv": {Data: []byte(ratings)}}
	_, err := shard.LoadMovieLens(fsys, shard.MovieLensConfig{Ratings: "r.csv"})
	var pe *shard.ParseError
	if !errors.As(err, &pe) || !errors.Is(err, shard.ErrMalformed) || pe.File != "r.csv" || pe.Line != 3 {
		t.Fatalf("want r.csv:3, got %v", err)
	}
	ml, err := shard.LoadMovieLens(fsys, shard.MovieLensConfig{Ratings: "r.csv", OnError: shard.SkipMalformed})
	if err != nil || ml.Len() != 2 || ml.Skipped() != 3 {
		t.Fatalf("skip: %v", err)
	}
	_, _, err = shard.ReadMovies(strings.NewReader("movieId,title,genres\n1,\"open,x\n"), "m.csv", shard.FailOnMalformed)
	if !errors.As(err, &pe) || pe.Line != 2 {
		t.Fatalf("movies: %v", err)
	}
}

func TestMovieLensData(t *testing.T) {
	requireMovieLens(t)
	fsys := os.DirFS(movieLensDir)
	ml, err := shard.LoadMovieLens(fsys, shard.MovieLensConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if ml.Len() != 100836 || ml.Skipped() != 0 || ml.Movies().Len() != 9742 {
		t.Fatalf("ratings %d skipped %d movies %d", ml.Len(), ml.Skipped(), ml.Movies().Len())
	}
	var rec shard.Record
	var pos int
	for i := range ml.Len() {
		if err := ml.ReadRecord(i, &rec); err != nil {
			t.Fatal(err)
		}
		pos += int(rec.Label)
	}
	if frac := float64(pos) / float64(ml.Len()); frac < 0.4 || frac > 0.55 {
		t.Fatalf("positive fraction %.3f", frac)
	}

	// The same ratings read as text shards through the parser give the same records.
	ctx := context.Background()
	shards, err := shard.SplitText(ctx, fsys, []string{"ratings.csv"}, shard.SplitConfig{RecordsPerShard: 10000, HeaderLines: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(shards) != 11 || shards[0].Line != 2 || shards[10].Base+shards[10].Records != 100836 {
		t.Fatalf("shards %+v", shards[0])
	}
	src := shard.TextSource{FS: fsys, Parser: shard.MovieLensRatings{Movies: ml.Movies()}}
	var want shard.Record
	for _, sh := range []shard.Shard{shards[0], shards[7], shards[10]} {
		cur, err := src.Open(ctx, shard.Lease{Shard: sh, Offset: 17})
		if err != nil {
			t.Fatal(err)
		}
		n := int64(17)
		for {
			err := cur.Next(&rec)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := ml.ReadRecord(sh.Global(rec.Offset), &want); err != nil {
				t.Fatal(err)
			}
			if !sameRecord(&rec, &want) {
				t.Fatalf("shard %d offset %d: %+v vs %+v", sh.Index, rec.Offset, rec, want)
			}
			n++
		}
		if n != sh.Records {
			t.Fatalf("shard %d: read %d of %d", sh.Index, n, sh.Records)
		}
		_ = cur.Close()
	}
}

func sameRecord(a, b *shard.Record) bool {
	if a.Label != b.Label || len(a.Dense) != len(b.Dense) || len(a.IDs) != len(b.IDs) || len(a.FieldEnds) != len(b.FieldEnds) {
		return false
	}
	for i := range a.Dense {
		if a.Dense[i] != b.Dense[i] {
			return false
		}
	}
	for i := range a.IDs {
		if a.IDs[i] != b.IDs[i] {
			return false
		}
	}
	for i := range a.FieldEnds {
		if a.FieldEnds[i] != b.FieldEnds[i] {
			return false
		}
	}
	return true
}

func FuzzMovieLens(f *testing.F) {
	movies, _, err := shard.ReadMovies(strings.NewReader(smallMovies), "movies.csv", shard.FailOnMalformed)
	if err != nil {
		f.Fatal(err)
	}
	p := shard.MovieLensRatings{Movies: movies}
	f.Add([]byte("1,1,4.0,964982703"), []byte(smallMovies))
	f.Add([]byte("1,3,0.5,0\r"), []byte("movieId,title,genres\n5,\"a \"\"b\"\", c (2001)\",X|Y\n"))
	f.Add([]byte("-1,1,4,5"), []byte("1,x,"))
	f.Fuzz(func(t *testing.T, line, moviesCSV []byte) {
		checkParsed(t, p, line)
		for _, policy := range []shard.ErrorPolicy{shard.FailOnMalformed, shard.SkipMalformed} {
			m, _, err := shard.ReadMovies(strings.NewReader(string(moviesCSV)), "m.csv", policy)
			if err != nil {
				continue
			}
			checkParsed(t, shard.MovieLensRatings{Movies: m}, line)
		}
	})
}

// TestMovieLens100K reads the MovieLens 100K layout (u.data tab-separated without a header,
// u.item pipe-separated with genre flags) into the same records as the CSV layout.
func TestMovieLens100K(t *testing.T) {
	flags := func(genres ...int) string {
		f := make([]string, 19)
		for i := range f {
			f[i] = "0"
		}
		for _, g := range genres {
			f[g] = "1"
		}
		return strings.Join(f, "|")
	}
	item := "1|Toy Story (1995)|01-Jan-1995||http://us.imdb.com/M/title-exact?Toy%20Story%20(1995)|" + flags(3, 4, 5) + "\n" +
		"2|GoldenEye (1995)|01-Jan-1995||http://x|" + flags(1, 2, 16) + "\n" +
		"3|unknown||||" + flags(0) + "\n"
	fsys := fstest.MapFS{
		"u.item":  {Data: []byte(item)},
		"u.data":  {Data: []byte("196\t1\t3\t881250949\n186\t2\t5\t891717742\n22\t3\t4\t878887116\n")},
		"u1.test": {Data: []byte("7\t2\t4\t875071561\n9\t99\t4\t875071561\n")},
	}
	ml, err := shard.LoadMovieLens(fsys, shard.MovieLensConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if ml.Len() != 3 || ml.Movies().Len() != 3 || shard.DefaultRatingsFile(fsys) != "u.data" {
		t.Fatalf("%d ratings, %d movies", ml.Len(), ml.Movies().Len())
	}
	var rec shard.Record
	if err := ml.ReadRecord(0, &rec); err != nil {
		t.Fatal(err)
	}
	want := []uint64{shard.FeatureIDString(shard.MovieLensFieldGenre, "Animation"), shard.FeatureIDString(shard.MovieLensFieldGenre, "Children's"), shard.FeatureIDString(shard.MovieLensFieldGenre, "Comedy")}
	if rec.Label != 0 || !slices.Equal(rec.Field(shard.MovieLensFieldGenre), want) || rec.Field(shard.MovieLensFieldYear)[0] != shard.FeatureIDInt(shard.MovieLensFieldYear, 1995) {
		t.Fatalf("record 0: %+v", rec)
	}
	if err := ml.ReadRecord(2, &rec); err != nil || rec.Label != 1 || len(rec.Field(shard.MovieLensFieldGenre)) != 0 || len(rec.Field(shard.MovieLensFieldYear)) != 0 {
		t.Fatalf("record 2 (genre unknown, no year): %v %+v", err, rec)
	}
	// A held-out ratings file joined with the training set's movies; an unknown movie is malformed.
	test, err := ml.Movies().LoadRatings(fsys, shard.MovieLensConfig{Ratings: "u1.test"})
	var pe *shard.ParseError
	if !errors.As(err, &pe) || pe.File != "u1.test" || pe.Line != 2 {
		t.Fatalf("want u1.test:2, got %v", err)
	}
	test, err = ml.Movies().LoadRatings(fsys, shard.MovieLensConfig{Ratings: "u1.test", OnError: shard.SkipMalformed})
	if err != nil || test.Len() != 1 || test.Skipped() != 1 {
		t.Fatalf("%v: %d ratings, %d skipped", err, test.Len(), test.Skipped())
	}
	// A split file of the 100K layout (u1.base) as the training ratings, its movies from u.item;
	// Line finds each rating's line past a skipped one.
	fsys["u1.base"] = &fstest.MapFile{Data: []byte("196\t1\t3\t881250949\nnot a rating\n22\t3\t4\t878887116\n")}
	base, err := shard.LoadMovieLens(fsys, shard.MovieLensConfig{Ratings: "u1.base", OnError: shard.SkipMalformed})
	if err != nil || base.Len() != 2 || base.Skipped() != 1 || base.Movies().Len() != 3 {
		t.Fatalf("u1.base: %v", err)
	}
	if base.Line(0) != 1 || base.Line(1) != 3 {
		t.Fatalf("u1.base lines %d, %d; want 1, 3", base.Line(0), base.Line(1))
	}
	csv := fstest.MapFS{"ratings.csv": {Data: []byte("userId,movieId,rating,timestamp\n1,1,4,1\n1,2,4,1\n")}, "movies.csv": {Data: []byte("movieId,title,genres\n1,a (1995),Drama\n2,b (1996),Drama\n")}}
	ml, err = shard.LoadMovieLens(csv, shard.MovieLensConfig{})
	if err != nil || ml.Line(0) != 2 || ml.Line(1) != 3 {
		t.Fatalf("ratings.csv after its header: %v", err)
	}
	bad := fstest.MapFS{"u.data": {Data: []byte("1\t1\t3\t1\n")}, "u.item": {Data: []byte("1|x|||\n")}}
	if _, err := shard.LoadMovieLens(bad, shard.MovieLensConfig{}); !errors.As(err, &pe) || pe.File != "u.item" || pe.Line != 1 {
		t.Fatalf("want u.item:1, got %v", err)
	}
}
