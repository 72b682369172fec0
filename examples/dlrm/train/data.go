package train

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
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
	synth    *model.Synth
}

// loadData builds the dataSet of cfg (defaults filled in).
func loadData(ctx context.Context, cfg *Config) (*dataSet, error) {
	switch cfg.Data.Kind {
	case Synthetic:
		return loadSynthetic(cfg)
	case MovieLens:
		return loadMovieLens(cfg)
	case Criteo:
		return loadText(ctx, cfg, shard.Criteo{}, nil)
	case LibSVM:
		return loadText(ctx, cfg, shard.LibSVM{}, []model.Pooling{model.PoolMean})
	}
	return nil, fmt.Errorf("%w: unknown data kind %v", ErrConfig, cfg.Data.Kind)
}

// synthTestFrom is the first record index of the synthetic held-out range: far beyond any
// training set, so the two never overlap.
const synthTestFrom = 1 << 40

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
		shuffle: true, test: test, ceiling: &ceil, synth: gen,
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

func loadMovieLens(cfg *Config) (*dataSet, error) {
	dir := cfg.Data.Paths[0]
	if st, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("movielens: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("movielens: %s is not a directory", dir)
	}
	ml, err := shard.LoadMovieLens(os.DirFS(dir), shard.MovieLensConfig{OnError: shard.SkipMalformed})
	if err != nil {
		return nil, err
	}
	n := int(ml.Len())
	nTest := int(float64(n) * cfg.TestFraction)
	if nTest < 2 || nTest >= n {
		return nil, fmt.Errorf("movielens: %d ratings cannot be split %v held out", n, cfg.TestFraction)
	}
	// A seeded permutation: the first nTest ratings are held out, the rest are trained in the
	// permuted order, so every shard is a random sample of users and movies.
	perm := rand.New(rand.NewPCG(cfg.Seed, 0x6d6f7669656c656e)).Perm(n)
	testIdx, trainIdx := perm[:nTest], perm[nTest:]
	var rec shard.Record
	keep := min(nTest, cfg.TestRecords)
	test := make([]model.Sample, keep)
	for i := range test {
		if err := ml.ReadRecord(int64(testIdx[i]), &rec); err != nil {
			return nil, err
		}
		sampleFromRecord(&test[i], &rec)
	}
	data := shard.IndexedFunc(int64(len(trainIdx)), func(i int64, rec *shard.Record) error {
		return ml.ReadRecord(int64(trainIdx[i]), rec)
	})
	schema := ml.Schema()
	pooling := make([]model.Pooling, len(schema.Fields))
	pooling[shard.MovieLensFieldGenre] = model.PoolMean
	return &dataSet{
		desc: fmt.Sprintf("MovieLens %s: %d ratings (%d skipped lines), %d movies; label = rating >= 4; fields %v, %d dense features",
			dir, n, ml.Skipped(), ml.Movies().Len(), schema.Fields, schema.Dense),
		fields: schema.Fields, dense: max(schema.Dense, 1), rawDense: schema.Dense, pooling: pooling,
		dataset: shard.IndexedDataset(int64(len(trainIdx))), source: shard.IndexedSource{Data: data},
		shuffle: true, test: test,
		heldOut: fmt.Sprintf("seeded random split: %d of %d ratings held out (%.0f%%), %d evaluated", nTest, n, 100*cfg.TestFraction, keep),
	}, nil
}

// osFS opens absolute operating-system paths given without their leading separator, so that
// files named on the command line can be read through fs.FS.
type osFS struct{ root string }

func (f osFS) Open(name string) (fs.File, error) {
	return os.Open(filepath.Join(f.root, filepath.FromSlash(name)))
}

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

func loadText(ctx context.Context, cfg *Config, parser shard.Parser, pooling []model.Pooling) (*dataSet, error) {
	fsys, names, err := fsNames(cfg.Data.Paths)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Data.Kind, err)
	}
	shards, err := shard.SplitText(ctx, fsys, names, shard.SplitConfig{RecordsPerShard: cfg.ShardSize})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Data.Kind, err)
	}
	src := shard.TextSource{FS: fsys, Parser: parser, OnError: shard.SkipMalformed}
	schema := parser.Schema()
	if pooling == nil {
		pooling = make([]model.Pooling, len(schema.Fields))
	}
	var lines int64
	for _, s := range shards {
		lines += s.Records
	}
	d := &dataSet{
		fields: schema.Fields, dense: max(schema.Dense, 1), rawDense: schema.Dense, pooling: pooling,
		dataset: shard.TextDataset(shards),
	}
	if len(cfg.TestFiles) > 0 {
		tfs, tnames, err := fsNames(cfg.TestFiles)
		if err != nil {
			return nil, fmt.Errorf("test files: %w", err)
		}
		tshards, err := shard.SplitText(ctx, tfs, tnames, shard.SplitConfig{RecordsPerShard: cfg.ShardSize})
		if err != nil {
			return nil, fmt.Errorf("test files: %w", err)
		}
		tsrc := shard.TextSource{FS: tfs, Parser: parser, OnError: shard.SkipMalformed}
		if d.test, err = readText(ctx, tsrc, tshards, cfg.TestRecords, nil); err != nil {
			return nil, fmt.Errorf("test files: %w", err)
		}
		d.source = src
		d.heldOut = fmt.Sprintf("test files %v: first %d records", cfg.TestFiles, len(d.test))
	} else {
		h := heldOut{seed: cfg.Seed, fraction: cfg.TestFraction}
		if d.test, err = readText(ctx, src, shards, cfg.TestRecords, h.is); err != nil {
			return nil, err
		}
		d.source = heldOutSource{inner: src, heldOut: h}
		d.heldOut = fmt.Sprintf("seeded random split: %.0f%% of lines held out, the first %d evaluated", 100*cfg.TestFraction, len(d.test))
	}
	if len(d.test) < 2 {
		return nil, fmt.Errorf("%s: only %d held-out records", cfg.Data.Kind, len(d.test))
	}
	d.desc = fmt.Sprintf("%s %v: %d lines in %d shards, %d dense features, %d fields", cfg.Data.Kind, cfg.Data.Paths, lines, len(shards), schema.Dense, len(schema.Fields))
	return d, nil
}

// readText reads up to limit records of the shards (those keep accepts by dataset position,
// or all) into samples.
func readText(ctx context.Context, src shard.Source, shards []shard.Shard, limit int, keep func(pos int64) bool) ([]model.Sample, error) {
	var out []model.Sample
	var rec shard.Record
	for i, s := range shards {
		s.Index = i
		cur, err := src.Open(ctx, shard.Lease{Shard: s})
		if err != nil {
			return nil, err
		}
		for len(out) < limit {
			err := cur.Next(&rec)
			if err == io.EOF {
				break
			}
			if err != nil {
				cur.Close()
				return nil, err
			}
			if keep != nil && !keep(s.Base+rec.Offset) {
				continue
			}
			out = append(out, model.Sample{})
			sampleFromRecord(&out[len(out)-1], &rec)
		}
		cur.Close()
		if len(out) >= limit {
			break
		}
	}
	return out, nil
}

// heldOut decides by a seeded hash of a record's dataset position whether it is held out.
type heldOut struct {
	seed     uint64
	fraction float64
}

func (h heldOut) is(pos int64) bool {
	z := h.seed ^ uint64(pos)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11)/(1<<53) < h.fraction
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
