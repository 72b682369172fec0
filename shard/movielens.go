package shard

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"sort"
	"strings"
	"time"
)

// MovieLens record layout: sparse fields and dense features.
const (
	MovieLensFieldUser  = 0 // the user id
	MovieLensFieldMovie = 1 // the movie id
	MovieLensFieldGenre = 2 // the movie's genres, zero or more ids
	MovieLensFieldYear  = 3 // the movie's release year, from its title; no id when unknown

	// MovieLensDense is the number of dense features: years since 1995 / 25, sine and cosine of
	// the hour of day, sine and cosine of the day of week (all of the rating's UTC timestamp),
	// and log(1 + the movie's age in years when rated; 0 when its year is unknown).
	MovieLensDense = 6
)

// movieLensSchema is the Schema of every MovieLens record.
func movieLensSchema() Schema {
	return Schema{Dense: MovieLensDense, Fields: []string{"user", "movie", "genres", "year"}}
}

// FeatureIDInt maps an integer categorical value of a field to a feature id, with the same
// field salting as FeatureID.
func FeatureIDInt(field int, v uint64) uint64 {
	return mix64(mix64(v+0x2545f4914f6cdd1d) ^ fieldSalt(field))
}

// Movies is the movies.csv table of a MovieLens data set, joined into ratings by movie id. It is
// immutable and safe for concurrent use.
type Movies struct {
	index     map[int64]int32 // movie id -> row
	year      []int16         // release year, 0 when unknown
	genreIDs  []uint64        // FeatureIDString(MovieLensFieldGenre, genre), row after row
	genreEnds []int32         // row r's genres are genreIDs[genreEnds[r-1]:genreEnds[r]]
}

// Len returns the number of movies.
func (m *Movies) Len() int { return len(m.year) }

// ReadMovies reads a MovieLens movies.csv (movieId,title,genres with a header line). name is used
// in error messages. Malformed lines fail or are skipped (and counted) per policy.
func ReadMovies(r io.Reader, name string, policy ErrorPolicy) (*Movies, int64, error) {
	m := &Movies{index: make(map[int64]int32)}
	var skipped int64
	var fields [][]byte
	err := eachLine(r, name, func(lineNo int64, line []byte) error {
		if lineNo == 1 && bytes.HasPrefix(line, []byte("movieId,")) {
			return nil
		}
		var err error
		fields, err = splitCSV(line, fields[:0])
		if err == nil && len(fields) != 3 {
			err = fmt.Errorf("%d columns, want 3", len(fields))
		}
		var id int64
		if err == nil {
			if id, err = parseInt64(fields[0]); err != nil {
				err = fmt.Errorf("movieId %q: %w", fields[0], err)
			} else if _, dup := m.index[id]; dup {
				err = fmt.Errorf("movieId %d listed twice", id)
			}
		}
		if err != nil {
			if policy == SkipMalformed {
				skipped++
				return nil
			}
			return &ParseError{File: name, Line: lineNo, Err: err}
		}
		m.index[id] = int32(len(m.year))
		m.year = append(m.year, titleYear(fields[1]))
		if g := fields[2]; !bytes.Equal(g, []byte("(no genres listed)")) && len(g) > 0 {
			for _, name := range bytes.Split(g, []byte("|")) {
				m.genreIDs = append(m.genreIDs, FeatureID(MovieLensFieldGenre, name))
			}
		}
		m.genreEnds = append(m.genreEnds, int32(len(m.genreIDs)))
		return nil
	})
	if err != nil {
		return nil, skipped, err
	}
	return m, skipped, nil
}

// movieLens100KGenres are the genre flag columns of the MovieLens 100K u.item, in order (its
// u.genre file).
var movieLens100KGenres = []string{"unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
	"Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
	"War", "Western"}

// ReadMovies100K reads the u.item file of the MovieLens 100K layout: "movie id | title | release
// date | video release date | IMDb URL | 19 genre flags", pipe-separated, no header. The
// "unknown" genre flag counts as no genre. name is used in error messages.
func ReadMovies100K(r io.Reader, name string, policy ErrorPolicy) (*Movies, int64, error) {
	m := &Movies{index: make(map[int64]int32)}
	var skipped int64
	err := eachLine(r, name, func(lineNo int64, line []byte) error {
		cols := bytes.Split(trimCR(line), []byte("|"))
		var err error
		var id int64
		switch {
		case len(cols) != 5+len(movieLens100KGenres):
			err = fmt.Errorf("%d columns, want %d", len(cols), 5+len(movieLens100KGenres))
		default:
			if id, err = parseInt64(cols[0]); err != nil {
				err = fmt.Errorf("movie id %q: %w", clip(cols[0]), err)
			} else if _, dup := m.index[id]; dup {
				err = fmt.Errorf("movie id %d listed twice", id)
			}
			for g, flag := range cols[5:] {
				if err == nil && string(flag) != "0" && string(flag) != "1" {
					err = fmt.Errorf("genre flag %s %q is not 0 or 1", movieLens100KGenres[g], clip(flag))
				}
			}
		}
		if err != nil {
			if policy == SkipMalformed {
				skipped++
				return nil
			}
			return &ParseError{File: name, Line: lineNo, Err: err}
		}
		m.index[id] = int32(len(m.year))
		m.year = append(m.year, titleYear(cols[1]))
		for g, flag := range cols[6:] { // cols[5] is "unknown"
			if flag[0] == '1' {
				m.genreIDs = append(m.genreIDs, FeatureIDString(MovieLensFieldGenre, movieLens100KGenres[g+1]))
			}
		}
		m.genreEnds = append(m.genreEnds, int32(len(m.genreIDs)))
		return nil
	})
	if err != nil {
		return nil, skipped, err
	}
	return m, skipped, nil
}

// titleYear extracts the release year from a title like "Heat (1995)" or "Fawlty Towers
// (1975-1979)"; 0 when there is none.
func titleYear(title []byte) int16 {
	title = bytes.TrimRight(title, " ")
	i := bytes.LastIndexByte(title, '(')
	if i < 0 || len(title)-i < 6 {
		return 0
	}
	y, err := parseInt64(title[i+1 : i+5])
	if err != nil || y < 1870 || y > 2100 {
		return 0
	}
	return int16(y)
}

// MovieLensRatings parses lines of a MovieLens ratings.csv (userId,movieId,rating,timestamp)
// and joins each with Movies. The label is 1 when rating >= Threshold, else 0. A rating of an
// unknown movie is malformed. A header line must be left out of the shards (SplitConfig
// HeaderLines: 1). Safe for concurrent use.
type MovieLensRatings struct {
	Movies *Movies // required
	// Threshold is the rating from which a record is positive. Default (0) 4.0.
	Threshold float32
}

var _ Parser = MovieLensRatings{}

// Schema returns the MovieLens layout: 6 dense features and fields user, movie, genres, year.
func (MovieLensRatings) Schema() Schema { return movieLensSchema() }

// Parse implements Parser.
func (p MovieLensRatings) Parse(line []byte, rec *Record) error {
	u, mv, rating, ts, err := parseRating(trimCR(line))
	if err != nil {
		return err
	}
	row, ok := p.Movies.index[mv]
	if !ok {
		return fmt.Errorf("movieId %d is not in movies.csv", mv)
	}
	p.Movies.fill(rec, u, mv, row, rating, ts, threshold(p.Threshold))
	return nil
}

func threshold(t float32) float32 {
	if t == 0 {
		return 4
	}
	return t
}

// parseRating splits "userId,movieId,rating,timestamp" (or the same separated by tabs, as the
// MovieLens 100K u.data is).
func parseRating(line []byte) (user, movie int64, rating float32, ts int64, err error) {
	var cols [4][]byte
	n := 0
	sep := byte(',')
	if bytes.IndexByte(line, '\t') >= 0 {
		sep = '\t'
	}
	for n < 4 {
		i := bytes.IndexByte(line, sep)
		if i < 0 {
			cols[n] = line
			n++
			line = nil
			break
		}
		cols[n] = line[:i]
		line = line[i+1:]
		n++
	}
	if n != 4 || line != nil {
		return 0, 0, 0, 0, fmt.Errorf("want 4 columns userId,movieId,rating,timestamp")
	}
	if user, err = parseInt64(cols[0]); err != nil || user < 0 {
		return 0, 0, 0, 0, fmt.Errorf("userId %q: bad", cols[0])
	}
	if movie, err = parseInt64(cols[1]); err != nil || movie < 0 {
		return 0, 0, 0, 0, fmt.Errorf("movieId %q: bad", cols[1])
	}
	if rating, err = parseFloat32(cols[2]); err != nil || !(rating >= 0 && rating <= 10) {
		return 0, 0, 0, 0, fmt.Errorf("rating %q: bad", cols[2])
	}
	if ts, err = parseInt64(cols[3]); err != nil || ts < 0 {
		return 0, 0, 0, 0, fmt.Errorf("timestamp %q: bad", cols[3])
	}
	return user, movie, rating, ts, nil
}

// epoch1995 is 1995-01-01T00:00:00Z, the origin of the first dense feature.
const epoch1995 = 788918400

// fill builds the record of one rating of movie row.
func (m *Movies) fill(rec *Record, user, movie int64, row int32, rating float32, ts int64, thr float32) {
	if rating >= thr {
		rec.Label = 1
	} else {
		rec.Label = 0
	}
	const day = 86400
	years := float64(ts-epoch1995) / (365.25 * day)
	hour := 2 * math.Pi * float64(ts%day) / day
	weekday := 2 * math.Pi * float64((ts/day+4)%7) / 7 // 1970-01-01 was a Thursday
	var age float64
	if y := m.year[row]; y != 0 {
		age = math.Log1p(max(0, float64(time.Unix(ts, 0).UTC().Year()-int(y))))
	}
	rec.Dense = append(rec.Dense,
		float32(years/25),
		float32(math.Sin(hour)), float32(math.Cos(hour)),
		float32(math.Sin(weekday)), float32(math.Cos(weekday)),
		float32(age))
	rec.IDs = append(rec.IDs, FeatureIDInt(MovieLensFieldUser, uint64(user)))
	rec.EndField()
	rec.IDs = append(rec.IDs, FeatureIDInt(MovieLensFieldMovie, uint64(movie)))
	rec.EndField()
	start := int32(0)
	if row > 0 {
		start = m.genreEnds[row-1]
	}
	rec.IDs = append(rec.IDs, m.genreIDs[start:m.genreEnds[row]]...)
	rec.EndField()
	if y := m.year[row]; y != 0 {
		rec.IDs = append(rec.IDs, FeatureIDInt(MovieLensFieldYear, uint64(y)))
	}
	rec.EndField()
}

// MovieLensConfig configures LoadMovieLens.
type MovieLensConfig struct {
	// Ratings and Movies are the file names within the file system. Default "ratings.csv" and
	// "movies.csv" (the layout of ml-latest-small and the larger sets), or, when the file system
	// has no ratings.csv but a u.data, "u.data" and "u.item" (the MovieLens 100K layout:
	// tab-separated ratings without a header, pipe-separated movies with genre flags). Ratings
	// may name any ratings file of either layout, such as the 100K splits u1.base to u5.base,
	// ua.base and ub.base; Movies then defaults to "movies.csv", or to "u.item" when the file
	// system has no movies.csv but a u.item. A Movies name ending in ".item" is read as a 100K
	// u.item.
	Ratings, Movies string
	// Threshold is the rating from which a record is positive. Default (0) 4.0.
	Threshold float32
	// OnError says what to do with a malformed line. Default FailOnMalformed.
	OnError ErrorPolicy
}

// MovieLens is a MovieLens ratings file joined with its movies, held in memory as columns (no
// pointers per rating). It is an Indexed data set: record i is the i-th rating of ratings.csv
// (skipped lines excluded). Immutable and safe for concurrent use.
type MovieLens struct {
	movies    *Movies
	threshold float32
	user      []int64
	movie     []int64
	row       []int32
	rating    []float32
	ts        []int64
	skipped   int64
	// gaps are the lines of the ratings file that hold no rating (a header, skipped lines), in
	// increasing order: with them Line finds a rating's line without a column of line numbers.
	gaps []int64
}

var _ Indexed = (*MovieLens)(nil)

// LoadMovieLens reads ratings and movies from fsys (for example os.DirFS of an ml-latest-small
// directory).
func LoadMovieLens(fsys fs.FS, cfg MovieLensConfig) (*MovieLens, error) {
	if cfg.Ratings == "" && cfg.Movies == "" && is100K(fsys) {
		cfg.Ratings, cfg.Movies = "u.data", "u.item"
	}
	if cfg.Ratings == "" {
		cfg.Ratings = "ratings.csv"
	}
	if cfg.Movies == "" {
		cfg.Movies = "movies.csv"
		if !exists(fsys, "movies.csv") && exists(fsys, "u.item") {
			cfg.Movies = "u.item"
		}
	}
	mf, err := fsys.Open(cfg.Movies)
	if err != nil {
		return nil, fmt.Errorf("shard: movielens: %w", err)
	}
	read := ReadMovies
	if strings.HasSuffix(cfg.Movies, ".item") {
		read = ReadMovies100K
	}
	movies, skipped, err := read(mf, cfg.Movies, cfg.OnError)
	_ = mf.Close()
	if err != nil {
		return nil, fmt.Errorf("shard: movielens: %w", err)
	}
	ml, err := movies.LoadRatings(fsys, cfg)
	if err != nil {
		return nil, err
	}
	ml.skipped += skipped
	return ml, nil
}

// is100K reports whether fsys holds the MovieLens 100K layout and not the CSV one.
func is100K(fsys fs.FS) bool {
	return !exists(fsys, "ratings.csv") && exists(fsys, "u.data")
}

// exists reports whether fsys has a file of that name.
func exists(fsys fs.FS, name string) bool {
	_, err := fs.Stat(fsys, name)
	return err == nil
}

// DefaultRatingsFile returns the ratings file LoadMovieLens reads from fsys by default:
// "u.data" in the MovieLens 100K layout, else "ratings.csv".
func DefaultRatingsFile(fsys fs.FS) string {
	if is100K(fsys) {
		return "u.data"
	}
	return "ratings.csv"
}

// LoadRatings reads the ratings file cfg.Ratings of fsys (default "ratings.csv") joined with
// these movies: a held-out ratings file of the same data set. A rating of a movie not in m is
// malformed.
func (m *Movies) LoadRatings(fsys fs.FS, cfg MovieLensConfig) (*MovieLens, error) {
	if cfg.Ratings == "" {
		cfg.Ratings = "ratings.csv"
	}
	movies := m
	ml := &MovieLens{movies: movies, threshold: threshold(cfg.Threshold)}
	rf, err := fsys.Open(cfg.Ratings)
	if err != nil {
		return nil, fmt.Errorf("shard: movielens: %w", err)
	}
	defer rf.Close()
	err = eachLine(rf, cfg.Ratings, func(lineNo int64, line []byte) error {
		line = trimCR(line)
		if lineNo == 1 && bytes.HasPrefix(line, []byte("userId,")) {
			ml.gaps = append(ml.gaps, lineNo)
			return nil
		}
		u, mv, rating, ts, err := parseRating(line)
		var row int32
		if err == nil {
			var ok bool
			if row, ok = movies.index[mv]; !ok {
				err = fmt.Errorf("movieId %d is not among the movies", mv)
			}
		}
		if err != nil {
			if cfg.OnError == SkipMalformed {
				ml.skipped++
				ml.gaps = append(ml.gaps, lineNo)
				return nil
			}
			return &ParseError{File: cfg.Ratings, Line: lineNo, Err: err}
		}
		ml.user = append(ml.user, u)
		ml.movie = append(ml.movie, mv)
		ml.row = append(ml.row, row)
		ml.rating = append(ml.rating, rating)
		ml.ts = append(ml.ts, ts)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("shard: movielens: %w", err)
	}
	return ml, nil
}

// Len returns the number of ratings.
func (m *MovieLens) Len() int64 { return int64(len(m.row)) }

// Skipped returns the malformed lines skipped while loading (SkipMalformed).
func (m *MovieLens) Skipped() int64 { return m.skipped }

// Line returns the 1-based line of the ratings file that rating i (0 <= i < Len) was read from.
func (m *MovieLens) Line(i int64) int64 {
	// The gaps before rating i are those with at most i ratings before them: gap j has
	// m.gaps[j]-1-j, a count that grows with j.
	k := sort.Search(len(m.gaps), func(j int) bool { return m.gaps[j]-1-int64(j) > i })
	return i + 1 + int64(k)
}

// Movies returns the joined movies table.
func (m *MovieLens) Movies() *Movies { return m.movies }

// Schema returns the MovieLens layout.
func (m *MovieLens) Schema() Schema { return movieLensSchema() }

// ReadRecord fills rec (which it resets) with rating i.
func (m *MovieLens) ReadRecord(i int64, rec *Record) error {
	if i < 0 || i >= int64(len(m.row)) {
		return fmt.Errorf("shard: movielens record %d out of range [0, %d)", i, len(m.row))
	}
	rec.Reset()
	m.movies.fill(rec, m.user[i], m.movie[i], m.row[i], m.rating[i], m.ts[i], m.threshold)
	return nil
}

// maxLine is the longest text line the readers accept.
const maxLine = 1 << 20

var errLongLine = errors.New("line longer than 1 MiB")

// eachLine calls fn with each line of r (without its newline) and its 1-based number.
func eachLine(r io.Reader, name string, fn func(lineNo int64, line []byte) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var lineNo int64
	var long []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long = append(long, chunk...)
			if len(long) > maxLine {
				return &ParseError{File: name, Line: lineNo + 1, Err: errLongLine}
			}
			continue
		}
		line := chunk
		if long != nil {
			line = append(long, chunk...)
			long = nil
		}
		if n := len(line); n > 0 && line[n-1] == '\n' {
			line = line[:n-1]
		}
		if len(line) > 0 || (err == nil) {
			lineNo++
			if ferr := fn(lineNo, line); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// splitCSV splits one CSV line into fields, appending them to dst. A field in double quotes may
// hold commas; its quotes are removed (a doubled quote inside stays doubled: callers here never
// need the text of such a field verbatim).
func splitCSV(line []byte, dst [][]byte) ([][]byte, error) {
	line = trimCR(line)
	for {
		if len(line) > 0 && line[0] == '"' {
			i := 1
			for {
				j := bytes.IndexByte(line[i:], '"')
				if j < 0 {
					return dst, fmt.Errorf("unterminated quoted field")
				}
				i += j + 1
				if i < len(line) && line[i] == '"' {
					i++ // doubled quote
					continue
				}
				break
			}
			dst = append(dst, line[1:i-1])
			line = line[i:]
			if len(line) == 0 {
				return dst, nil
			}
			if line[0] != ',' {
				return dst, fmt.Errorf("text after a closing quote")
			}
			line = line[1:]
			continue
		}
		i := bytes.IndexByte(line, ',')
		if i < 0 {
			return append(dst, line), nil
		}
		dst = append(dst, line[:i])
		line = line[i+1:]
	}
}
