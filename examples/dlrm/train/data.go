package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/shard"
)

// dataSet is what a run trains and evaluates on: a dataset the dispatcher cuts into shards, the
// source workers read shards from, and the held-out samples evaluated exactly.
type dataSet struct {
	desc     string
	fields   []string        // sparse field names, one embedding table each
	dense    int             // dense features the model sees (at least 1)
	rawDense int             // dense features in the records (0: the model gets a constant 1)
	pooling  []model.Pooling // per field
	dataset  shard.Dataset
	source   shard.Source
	shuffle  bool // shuffle records within shards (indexed data only)
	test     []model.Sample
	ceiling  *model.Ceiling // synthetic data: the hidden model on the test records
	heldOut  string         // how the held-out set was made
	// valid is the validation set carved from the training data (Config.ValidFraction; empty
	// without), never trained: periodic evaluations and keep-best score it instead of the
	// test set. validOut says how it was made.
	valid    []model.Sample
	validOut string
	synth    *model.Synth
	// Text data: the malformed lines of the data and test files, and what the summary should
	// point out about the input (such as every feature landing in one field).
	bad   *shard.BadLines
	notes []string

	// testAt and validAt say where each test and validation record comes from.
	testAt, validAt *origins
	// trainRecs and testRecs are the records trained and the test records evaluated, as parsed,
	// for the overlap check (nil for synthetic data); split says that the test records are a
	// random split of the training data. overlap is what the check found.
	trainRecs, testRecs records
	split               bool
	overlap             *Overlap
}

// loadData builds the dataSet of cfg (defaults filled in).
func loadData(ctx context.Context, cfg *Config) (*dataSet, error) {
	switch cfg.Data.Kind {
	case Synthetic:
		return loadSynthetic(cfg)
	case MovieLens:
		return loadMovieLens(cfg)
	case Criteo, LibSVM, LibFM:
		return loadText(ctx, cfg)
	}
	return nil, fmt.Errorf("%w: unknown data kind %v", ErrConfig, cfg.Data.Kind)
}

// synthTestFrom is the first record index of the synthetic held-out range: far beyond any
// training set, so the two never overlap.
const synthTestFrom = 1 << 40

// synthValidFrom is the first record index of the synthetic validation range
// (Config.ValidFraction), beyond the held-out one.
const synthValidFrom = 1 << 41

func loadSynthetic(cfg *Config) (*dataSet, error) {
	sc := cfg.Synth
	sc.Seed = cfg.Seed
	gen, err := model.NewSynth(sc)
	if err != nil {
		return nil, err
	}
	sc = gen.Config()
	fields := make([]string, len(sc.Vocab))
	for i := range fields {
		fields[i] = fmt.Sprintf("C%d", i+1)
	}
	pool := sync.Pool{New: func() any { return new(model.Sample) }}
	data := shard.IndexedFunc(cfg.TrainRecords, func(i int64, rec *shard.Record) error {
		s := pool.Get().(*model.Sample)
		defer pool.Put(s)
		gen.Sample(uint64(i), s)
		recordFromSample(rec, s)
		return nil
	})
	test := make([]model.Sample, cfg.TestRecords)
	for i := range test {
		gen.Sample(synthTestFrom+uint64(i), &test[i])
	}
	ceil, err := gen.Ceiling(synthTestFrom, synthTestFrom+uint64(cfg.TestRecords))
	if err != nil {
		return nil, err
	}
	var valid []model.Sample
	validOut := ""
	if cfg.ValidFraction > 0 {
		// The generator has no end: the validation records have their own range, as many as
		// the fraction of the training records (at most TestRecords), and training keeps all
		// of its own.
		nValid := min(int(float64(cfg.TrainRecords)*cfg.ValidFraction), cfg.TestRecords)
		if nValid < 2 {
			return nil, fmt.Errorf("synthetic: %d training records cannot give %v to validation", cfg.TrainRecords, cfg.ValidFraction)
		}
		valid = make([]model.Sample, nValid)
		for i := range valid {
			gen.Sample(synthValidFrom+uint64(i), &valid[i])
		}
		validOut = fmt.Sprintf("%d generated records [2^41, 2^41+%d)", nValid, nValid)
	}
	vocab := 0
	for _, v := range sc.Vocab {
		vocab += v
	}
	return &dataSet{
		desc: fmt.Sprintf("synthetic Criteo-like data (seed %d): %d training records, %d dense features, %d fields, %d ids, Zipf(%.2f)",
			cfg.Seed, cfg.TrainRecords, sc.DenseFeatures, len(sc.Vocab), vocab, sc.ZipfExponent),
		fields: fields, dense: sc.DenseFeatures, rawDense: sc.DenseFeatures,
		pooling: make([]model.Pooling, len(fields)),
		dataset: shard.IndexedDataset(cfg.TrainRecords), source: shard.IndexedSource{Data: data},
		shuffle: true, test: test, ceiling: &ceil, synth: gen, valid: valid, validOut: validOut,
		testAt: indexOrigins("record", synthTestFrom, len(test)), validAt: indexOrigins("record", synthValidFrom, len(valid)),
		heldOut: fmt.Sprintf("%d generated records [2^40, 2^40+%d)", cfg.TestRecords, cfg.TestRecords),
	}, nil
}

// recordFromSample writes a generated sample into a shard record.
func recordFromSample(rec *shard.Record, s *model.Sample) {
	rec.Label = s.Label
	rec.Dense = append(rec.Dense[:0], s.Dense...)
	for f := 0; f+1 < len(s.Offsets); f++ {
		rec.IDs = append(rec.IDs, s.IDs[s.Offsets[f]:s.Offsets[f+1]]...)
		rec.EndField()
	}
}

// sampleFromRecord copies a shard record into a model sample (the model needs at least one
// dense feature: records without any get a constant 1).
func sampleFromRecord(s *model.Sample, rec *shard.Record) {
	s.Label = rec.Label
	if len(rec.Dense) == 0 {
		s.Dense = append(s.Dense[:0], 1)
	} else {
		s.Dense = append(s.Dense[:0], rec.Dense...)
	}
	s.IDs = append(s.IDs[:0], rec.IDs...)
	s.Values = append(s.Values[:0], rec.Values...)
	s.Offsets = append(s.Offsets[:0], 0)
	s.Offsets = append(s.Offsets, rec.FieldEnds...)
}

// loadMovieLens reads the MovieLens data of cfg: a directory (its ratings.csv, or the 100K
// layout's u.data) or one ratings file (such as the 100K layout's u1.base), with the movies of
// its directory (movies.csv, or the 100K layout's u.item).
func loadMovieLens(cfg *Config) (*dataSet, error) {
	path := cfg.Data.Paths[0]
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("movielens: %w", err)
	}
	dir, mcfg := path, shard.MovieLensConfig{OnError: shard.SkipMalformed}
	if st.IsDir() {
		mcfg.Ratings = shard.DefaultRatingsFile(os.DirFS(dir))
	} else {
		dir, mcfg.Ratings = filepath.Dir(path), filepath.Base(path)
	}
	ml, err := shard.LoadMovieLens(os.DirFS(dir), mcfg)
	if err != nil {
		return nil, err
	}
	ratings := filepath.Join(dir, mcfg.Ratings)
	if len(cfg.TestFiles) > 0 {
		return movieLensWithTest(cfg, ratings, ml)
	}
	n := int(ml.Len())
	nTest := int(float64(n) * cfg.TestFraction)
	if nTest < 2 || nTest >= n {
		return nil, fmt.Errorf("movielens: %d ratings cannot be split %v held out", n, cfg.TestFraction)
	}
	// A seeded permutation: the first nTest ratings are held out, the rest are trained in the
	// permuted order, so every shard is a random sample of users and movies.
	// The validation ratings (Config.ValidFraction) come next, carved from the training part:
	// the test split is the same with or without them.
	perm := rand.New(rand.NewPCG(cfg.Seed, 0x6d6f7669656c656e)).Perm(n)
	nValid := int(float64(n-nTest) * cfg.ValidFraction)
	if cfg.ValidFraction > 0 && (nValid < 2 || nTest+nValid >= n) {
		return nil, fmt.Errorf("movielens: %d training ratings cannot give %v to validation", n-nTest, cfg.ValidFraction)
	}
	testIdx, validIdx, trainIdx := perm[:nTest], perm[nTest:nTest+nValid], perm[nTest+nValid:]
	feat, err := newMovieLensFeatures(cfg, ml, trainIdx)
	if err != nil {
		return nil, err
	}
	keep := min(nTest, cfg.TestRecords)
	test, err := feat.samples(ml, testIdx[:keep])
	if err != nil {
		return nil, err
	}
	valid, err := feat.samples(ml, validIdx[:min(nValid, cfg.TestRecords)])
	if err != nil {
		return nil, err
	}
	validOut := ""
	if nValid > 0 {
		validOut = fmt.Sprintf("seeded random split of the training ratings: %d held out (%.0f%%), %d evaluated", nValid, 100*cfg.ValidFraction, len(valid))
	}
	fields := movieLensFields(cfg)
	return &dataSet{
		desc: fmt.Sprintf("MovieLens %s: %d ratings (%d skipped lines), %d movies; label = rating >= 4; fields %v, %d dense features%s",
			ratings, n, ml.Skipped(), ml.Movies().Len(), fields, ml.Schema().Dense, feat.describe()),
		fields: fields, dense: max(ml.Schema().Dense, 1), rawDense: ml.Schema().Dense, pooling: movieLensPooling(fields),
		dataset: shard.IndexedDataset(int64(len(trainIdx))), source: shard.IndexedSource{Data: feat.dataset(ml, trainIdx)},
		shuffle: true, test: test, valid: valid, validOut: validOut,
		testAt:    ratingOrigins(ratings, testIdx[:keep]),
		validAt:   ratingOrigins(ratings, validIdx[:len(valid)]),
		trainRecs: movieLensRecords(ml, ratings, trainIdx), testRecs: movieLensRecords(ml, ratings, testIdx[:keep]), split: true,
		heldOut: fmt.Sprintf("seeded random split: %d of %d ratings held out (%.0f%%), %d evaluated", nTest, n, 100*cfg.TestFraction, keep),
	}, nil
}

// movieLensWithTest trains every rating of ml (read from the file ratings) and holds out the
// ratings of cfg.TestFiles[0]: a directory (its ratings file, ratings.csv or the 100K layout's
// u.data) or a ratings file (such as the 100K layout's u1.test), joined with ml's movies.
func movieLensWithTest(cfg *Config, ratings string, ml *shard.MovieLens) (*dataSet, error) {
	path := cfg.TestFiles[0]
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("movielens test: %w", err)
	}
	tdir, name := filepath.Dir(path), filepath.Base(path)
	if st.IsDir() {
		tdir, name = path, shard.DefaultRatingsFile(os.DirFS(path))
	}
	tml, err := ml.Movies().LoadRatings(os.DirFS(tdir), shard.MovieLensConfig{Ratings: name, OnError: shard.SkipMalformed})
	if err != nil {
		return nil, fmt.Errorf("movielens test: %w", err)
	}
	keep := min(int(tml.Len()), cfg.TestRecords)
	if keep < 2 {
		return nil, fmt.Errorf("movielens test: %s holds %d ratings of known movies (%d lines skipped)", path, tml.Len(), tml.Skipped())
	}
	// Validation ratings (Config.ValidFraction): a seeded random share of the training file's.
	n := int(ml.Len())
	var trainIdx, validIdx []int
	validOut := ""
	if cfg.ValidFraction > 0 {
		perm := rand.New(rand.NewPCG(cfg.Seed, 0x76616c6964)).Perm(n)
		nValid := int(float64(n) * cfg.ValidFraction)
		if nValid < 2 || nValid >= n {
			return nil, fmt.Errorf("movielens: %d training ratings cannot give %v to validation", n, cfg.ValidFraction)
		}
		validIdx, trainIdx = perm[:min(nValid, cfg.TestRecords)], perm[nValid:]
		validOut = fmt.Sprintf("seeded random split of the training ratings: %d held out (%.0f%%), %d evaluated", nValid, 100*cfg.ValidFraction, len(validIdx))
		n = len(trainIdx)
	} else {
		trainIdx = rangeInts(n)
	}
	feat, err := newMovieLensFeatures(cfg, ml, trainIdx)
	if err != nil {
		return nil, err
	}
	testIdx := rangeInts(keep)
	test, err := feat.samples(tml, testIdx)
	if err != nil {
		return nil, err
	}
	valid, err := feat.samples(ml, validIdx)
	if err != nil {
		return nil, err
	}
	fields := movieLensFields(cfg)
	return &dataSet{
		desc: fmt.Sprintf("MovieLens %s: %d ratings (%d skipped lines), %d movies; label = rating >= 4; fields %v, %d dense features%s",
			ratings, ml.Len(), ml.Skipped(), ml.Movies().Len(), fields, ml.Schema().Dense, feat.describe()),
		fields: fields, dense: max(ml.Schema().Dense, 1), rawDense: ml.Schema().Dense, pooling: movieLensPooling(fields),
		dataset: shard.IndexedDataset(int64(n)), source: shard.IndexedSource{Data: feat.dataset(ml, trainIdx)},
		shuffle: true, test: test, valid: valid, validOut: validOut,
		testAt:    ratingOrigins(filepath.Join(tdir, name), testIdx),
		validAt:   ratingOrigins(ratings, validIdx),
		trainRecs: movieLensRecords(ml, ratings, trainIdx), testRecs: movieLensRecords(tml, filepath.Join(tdir, name), testIdx),
		heldOut: fmt.Sprintf("test ratings %s: %d of %d evaluated (%d lines skipped)", filepath.Join(tdir, name), keep, tml.Len(), tml.Skipped()),
	}, nil
}

// osFS opens absolute operating-system paths given without their leading separator, so that
// files named on the command line can be read through fs.FS.
type osFS struct{ root string }

func (f osFS) Open(name string) (fs.File, error) {
	return os.Open(f.path(name))
}

// path is the operating-system path of name.
func (f osFS) path(name string) string { return filepath.Join(f.root, filepath.FromSlash(name)) }

// fsNames turns command-line paths into names for osFS.
func fsNames(paths []string) (osFS, []string, error) {
	var root string
	names := make([]string, len(paths))
	for i, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			return osFS{}, nil, err
		}
		st, err := os.Stat(abs)
		if err != nil {
			return osFS{}, nil, err
		}
		if st.IsDir() {
			return osFS{}, nil, fmt.Errorf("%s is a directory, want a file", p)
		}
		r := filepath.VolumeName(abs) + string(filepath.Separator)
		if i > 0 && r != root {
			return osFS{}, nil, fmt.Errorf("%s is on another volume than %s", p, paths[0])
		}
		root = r
		rel, err := filepath.Rel(root, abs)
		if err != nil {
			return osFS{}, nil, err
		}
		names[i] = filepath.ToSlash(rel)
	}
	return osFS{root: root}, names, nil
}

// textInput is how a run reads its text files: the parser, the pooling of its fields and what
// the summary should point out about them.
type textInput struct {
	parser  shard.Parser
	pooling []model.Pooling
	note    string
}

// textParser chooses the parser of cfg's text data (defaults filled in). For libFM data without
// a field count it reads the count from the first MiB of every file.
func textParser(cfg *Config) (textInput, error) {
	var in textInput
	pool := model.PoolSum
	switch cfg.Data.Kind {
	case Criteo:
		in.parser = shard.Criteo{}
	case LibSVM:
		if cfg.FieldMap == "" {
			pool = model.PoolMean
			in.parser = shard.LibSVM{}
			in.note = `every libSVM feature lands in one field ("features"): the model pools them into one vector and has no pair of fields to interact, a logistic regression in effect; give -field-map NAME=LO-HI,... (or a file of such lines), or write the data as libfm`
			break
		}
		fm, err := shard.ParseFieldMap(cfg.FieldMap)
		if err != nil {
			return in, err
		}
		in.parser = shard.LibSVM{Fields: fm}
		in.note = fmt.Sprintf("libSVM features in %d fields by the field map %s", len(fm.Names()), fm)
	case LibFM:
		n := cfg.Fields
		if n == 0 {
			var err error
			if n, err = libfmFields(append(append([]string(nil), cfg.Data.Paths...), cfg.TestFiles...)); err != nil {
				return in, err
			}
			in.note = fmt.Sprintf("%d libFM fields: the highest field index in the first MiB of the files, plus one (-fields sets the count; a line with a field beyond it is malformed)", n)
		}
		in.parser = shard.LibFM{Fields: n}
	default:
		return in, fmt.Errorf("%w: %s is not text data", ErrConfig, cfg.Data.Kind)
	}
	switch cfg.Pooling {
	case "sum":
		pool = model.PoolSum
	case "mean":
		pool = model.PoolMean
	}
	in.pooling = make([]model.Pooling, len(in.parser.Schema().Fields))
	if cfg.Data.Kind != Criteo {
		for i := range in.pooling {
			in.pooling[i] = pool
		}
	}
	return in, nil
}

// libfmFields returns the field count the first MiB of each file uses (shard.LibFMFields).
func libfmFields(paths []string) (int, error) {
	n := 0
	buf := make([]byte, 1<<20)
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return 0, fmt.Errorf("libfm: %w", err)
		}
		k, err := io.ReadFull(f, buf)
		f.Close()
		if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
			return 0, fmt.Errorf("libfm: %s: %w", p, err)
		}
		m := shard.LibFMFields(buf[:k])
		if m == 0 {
			return 0, fmt.Errorf("libfm: %s has no field:feature:value in its first lines: not libFM data (plain libSVM is libsvm:, with -field-map for its fields)", p)
		}
		n = max(n, m)
	}
	return n, nil
}

func loadText(ctx context.Context, cfg *Config) (*dataSet, error) {
	in, err := textParser(cfg)
	if err != nil {
		return nil, err
	}
	parser := in.parser
	fsys, names, err := fsNames(cfg.Data.Paths)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Data.Kind, err)
	}
	shards, err := shard.SplitText(ctx, fsys, names, shard.SplitConfig{RecordsPerShard: cfg.ShardSize})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Data.Kind, err)
	}
	var lines int64
	for _, s := range shards {
		lines += s.Records
	}
	if lines == 0 {
		return nil, fmt.Errorf("%s %v: %w: the files hold no line", cfg.Data.Kind, cfg.Data.Paths, ErrNothingTrained)
	}
	var tfs osFS
	var tshards []shard.Shard
	var tnames []string
	if len(cfg.TestFiles) > 0 {
		if tfs, tnames, err = fsNames(cfg.TestFiles); err != nil {
			return nil, fmt.Errorf("test files: %w", err)
		}
		if tshards, err = shard.SplitText(ctx, tfs, tnames, shard.SplitConfig{RecordsPerShard: cfg.ShardSize}); err != nil {
			return nil, fmt.Errorf("test files: %w", err)
		}
	}
	// One account of malformed lines for the data and the test files, shown by the paths given.
	bad := shard.NewBadLines(shard.BadLinesConfig{MaxFraction: cfg.MaxBadFraction}, shards, tshards)
	bad.Name = func(name string) string { return filepath.Join(fsys.root, filepath.FromSlash(name)) }
	onError := shard.SkipMalformed
	if cfg.BadLines == FailOnBadLine {
		onError = shard.FailOnMalformed
	}
	src := shard.TextSource{FS: fsys, Parser: parser, OnError: onError, Bad: bad}
	schema := parser.Schema()
	d := &dataSet{
		fields: schema.Fields, dense: max(schema.Dense, 1), rawDense: schema.Dense, pooling: in.pooling,
		dataset: shard.TextDataset(shards), bad: bad,
	}
	if in.note != "" {
		d.notes = append(d.notes, in.note)
	}
	// Held out by hash: the test records (without test files) and the validation records
	// (Config.ValidFraction, a share of what is left for training), neither trained.
	test, valid := heldOut{seed: cfg.Seed}, heldOut{seed: cfg.Seed}
	if len(cfg.TestFiles) == 0 {
		test.hi = cfg.TestFraction
	}
	valid.lo, valid.hi = test.hi, test.hi+cfg.ValidFraction*(1-test.hi)
	// The overlap check reads through sources of their own that skip malformed lines without
	// counting them: training counts them, and stops on them, as it would without the check.
	quiet := shard.TextSource{FS: fsys, Parser: parser, OnError: shard.SkipMalformed}
	tquiet := shard.TextSource{FS: tfs, Parser: parser, OnError: shard.SkipMalformed}
	// The files by the paths given, for the overlap check's file:line.
	given := map[string]string{}
	for i, n := range names {
		given[n] = cfg.Data.Paths[i]
	}
	if len(cfg.TestFiles) > 0 {
		tsrc := shard.TextSource{FS: tfs, Parser: parser, OnError: onError, Bad: bad}
		d.testAt = textOrigins(tfs.path)
		if d.test, err = readText(ctx, tsrc, tshards, cfg.TestRecords, nil, d.testAt); err != nil {
			return nil, fmt.Errorf("test files: %w", err)
		}
		d.heldOut = fmt.Sprintf("test files %v: first %d records", cfg.TestFiles, len(d.test))
		tgiven := map[string]string{}
		for i, n := range tnames {
			tgiven[n] = cfg.TestFiles[i]
		}
		d.testRecs = textRecords(tquiet, tshards, len(d.test), nil, func(n string) string { return tgiven[n] })
	} else {
		d.testAt = textOrigins(fsys.path)
		if d.test, err = readText(ctx, src, shards, cfg.TestRecords, test.is, d.testAt); err != nil {
			return nil, err
		}
		d.heldOut = fmt.Sprintf("seeded random split: %.0f%% of lines held out, the first %d evaluated", 100*cfg.TestFraction, len(d.test))
		d.testRecs = textRecords(quiet, shards, len(d.test), test.is, func(n string) string { return given[n] })
		d.split = true
	}
	d.source = src
	if valid.hi > valid.lo {
		d.validAt = textOrigins(fsys.path)
		if d.valid, err = readText(ctx, src, shards, cfg.TestRecords, valid.is, d.validAt); err != nil {
			return nil, err
		}
		if len(d.valid) < 2 {
			return nil, fmt.Errorf("%s: only %d validation records", cfg.Data.Kind, len(d.valid))
		}
		d.validOut = fmt.Sprintf("seeded random split of the training lines: %.0f%% held out, the first %d evaluated", 100*cfg.ValidFraction, len(d.valid))
	}
	if valid.hi > 0 {
		d.source = heldOutSource{inner: src, heldOut: heldOut{seed: cfg.Seed, hi: valid.hi}}
	}
	if err := errors.Join(checkClicks("test", d.test, d.testAt), checkClicks("validation", d.valid, d.validAt)); err != nil {
		return nil, err
	}
	var trained shard.Source = quiet
	if valid.hi > 0 {
		trained = heldOutSource{inner: quiet, heldOut: heldOut{seed: cfg.Seed, hi: valid.hi}}
	}
	d.trainRecs = textRecords(trained, shards, -1, nil, func(n string) string { return given[n] })
	if len(d.test) < 2 {
		err := fmt.Errorf("%s: only %d held-out records", cfg.Data.Kind, len(d.test))
		if r := bad.Report(); r.Bad > 0 {
			err = fmt.Errorf("%w; %d malformed lines:%s", err, r.Bad, exampleLines(r.Examples))
		}
		return nil, err
	}
	pooled := ""
	if cfg.Data.Kind != Criteo {
		pooled = fmt.Sprintf(" (several features of a field: their rows weighted by their values, %s-pooled)", in.pooling[0])
	}
	d.desc = fmt.Sprintf("%s %v: %d lines in %d shards, %d dense features, %d fields%s", cfg.Data.Kind, cfg.Data.Paths, lines, len(shards), schema.Dense, len(schema.Fields), pooled)
	return d, nil
}

// exampleLines formats bad lines as "\n  file:line: reason" each.
func exampleLines(ex []*shard.ParseError) string {
	var b strings.Builder
	for _, e := range ex {
		fmt.Fprintf(&b, "\n  %s:%d: %v", e.File, e.Line, e.Err)
	}
	return b.String()
}

// readText reads up to limit records of the shards (those keep accepts by dataset position,
// or all) into samples, and adds their origins to at (nil: none).
func readText(ctx context.Context, src shard.Source, shards []shard.Shard, limit int, keep func(pos int64) bool, at *origins) ([]model.Sample, error) {
	var out []model.Sample
	err := eachText(ctx, src, shards, limit, keep, func(sh shard.Shard, rec *shard.Record) error {
		out = append(out, model.Sample{})
		sampleFromRecord(&out[len(out)-1], rec)
		at.add(sh.File, sh.Line+rec.Offset) // the shard is read in file order
		return nil
	})
	return out, err
}

// eachText calls fn with up to limit records of the shards of src in their order (those keep
// accepts by dataset position, or all; limit < 0: no limit), each with its shard.
func eachText(ctx context.Context, src shard.Source, shards []shard.Shard, limit int, keep func(pos int64) bool, fn func(sh shard.Shard, rec *shard.Record) error) error {
	var rec shard.Record
	n := 0
	for i, s := range shards {
		if limit >= 0 && n >= limit {
			break
		}
		s.Index = i
		cur, err := src.Open(ctx, shard.Lease{Shard: s})
		if err != nil {
			return err
		}
		for limit < 0 || n < limit {
			err := cur.Next(&rec)
			if err == io.EOF {
				break
			}
			if err == nil && keep != nil && !keep(s.Base+rec.Offset) {
				continue
			}
			if err == nil {
				err = fn(s, &rec)
			}
			if err != nil {
				cur.Close()
				return err
			}
			n++
		}
		cur.Close()
	}
	return nil
}

// heldOut decides by a seeded hash of a record's dataset position whether it is held out: the
// records whose hash, a uniform number in [0, 1), falls in [lo, hi).
type heldOut struct {
	seed   uint64
	lo, hi float64
}

func (h heldOut) is(pos int64) bool {
	z := h.seed ^ uint64(pos)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	u := float64(z>>11) / (1 << 53)
	return u >= h.lo && u < h.hi
}

// heldOutSource serves text shards without their held-out records: a held-out record is a gap in
// the offsets, covered by progress like a skipped line.
type heldOutSource struct {
	inner   shard.Source
	heldOut heldOut
}

func (s heldOutSource) Open(ctx context.Context, l shard.Lease) (shard.Cursor, error) {
	c, err := s.inner.Open(ctx, l)
	if err != nil {
		return nil, err
	}
	return &heldOutCursor{inner: c, base: l.Shard.Base, h: s.heldOut}, nil
}

type heldOutCursor struct {
	inner shard.Cursor
	base  int64
	h     heldOut
}

func (c *heldOutCursor) Next(rec *shard.Record) error {
	for {
		if err := c.inner.Next(rec); err != nil {
			return err
		}
		if !c.h.is(c.base + rec.Offset) {
			return nil
		}
	}
}

func (c *heldOutCursor) Close() error { return c.inner.Close() }
