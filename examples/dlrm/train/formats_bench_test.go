package train_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/elasticps/elasticps/shard"
)

// BenchmarkFormats trains the same generated Criteo-like records (13 dense features, 26
// single-valued fields: the trainer's default synthetic data) from each input format, in one
// run, and splits each format's cost into its stages:
//
//   - parse_rec/s: the lines read and parsed through shard.TextSource, as a worker reads them;
//   - compute_samples/s: the model's forward and backward pass alone (no parameter server) on
//     batches of those records, with the model shape the format gives (its field count);
//   - samples/s: the whole trainer (train.Run: two servers, two workers, one epoch), and
//     test_auc, the AUC it reaches on the same 2000 held-out records in every format.
//
// The generator case trains the same records from memory (no text at all): the baseline of
// the parsing cost. Formats: Criteo TSV (26 fields and 13 dense features into the bottom MLP),
// libFM (39 fields: each dense feature its own field of one weighted feature), libSVM with a
// field map (27 fields: the 13 dense features pooled in one, each categorical range its own)
// and plain libSVM (every feature in one field). Run with -benchtime 1x; set
// DLRM_BENCH_RECORDS for another size (default 60 000).
func BenchmarkFormats(b *testing.B) {
	records := uint64(60_000)
	if v := os.Getenv("DLRM_BENCH_RECORDS"); v != "" {
		if _, err := fmt.Sscan(v, &records); err != nil || records < 1000 {
			b.Fatalf("DLRM_BENCH_RECORDS=%q: want a count of at least 1000", v)
		}
	}
	const tests = 2000
	sc := model.SynthConfig{Seed: 5}
	g, err := model.NewSynth(sc)
	if err != nil {
		b.Fatal(err)
	}
	sc = g.Config()
	dir := b.TempDir()
	tsv, ffm, svm := writeFormats(b, g, dir, "train", 0, records)
	ttsv, tffm, tsvm := writeFormats(b, g, dir, "test", synthTestFrom, tests)
	dense := []string{fmt.Sprintf("dense=0-%d", sc.DenseFeatures-1)}
	for f := range sc.Vocab {
		dense = append(dense, fmt.Sprintf("c%d=%d-%d", f, (f+1)*1_000_000, (f+1)*1_000_000+999_999))
	}
	fieldMap := strings.Join(dense, ",")

	for _, c := range []struct {
		name   string
		kind   string
		path   string
		test   string
		fmap   string
		parser shard.Parser
	}{
		{"generator", "", "", "", "", nil},
		{"criteo", "criteo", tsv, ttsv, "", shard.Criteo{}},
		{"libfm", "libfm", ffm, tffm, "", shard.LibFM{Fields: sc.DenseFeatures + len(sc.Vocab)}},
		{"libsvm-fieldmap", "libsvm", svm, tsvm, fieldMap, nil},
		{"libsvm", "libsvm", svm, tsvm, "", shard.LibSVM{}},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := train.Config{Seed: sc.Seed, Epochs: 1, TestRecords: tests, CheckpointEvery: -1, EvalEvery: -1}
			parser := c.parser
			if c.kind == "" {
				cfg.TrainRecords = int64(records)
			} else {
				spec, err := train.ParseDataSpec(c.kind + ":" + c.path)
				if err != nil {
					b.Fatal(err)
				}
				cfg.Data, cfg.TestFiles, cfg.FieldMap = spec, []string{c.test}, c.fmap
				if c.fmap != "" {
					fm, err := shard.ParseFieldMap(c.fmap)
					if err != nil {
						b.Fatal(err)
					}
					parser = shard.LibSVM{Fields: fm}
				}
			}
			var samples []model.Sample
			if parser != nil {
				start := time.Now()
				samples = readAll(b, parser, c.path)
				b.ReportMetric(float64(len(samples))/time.Since(start).Seconds(), "parse_rec/s")
			} else {
				samples = make([]model.Sample, min(records, 20_000))
				for i := range samples {
					g.Sample(uint64(i), &samples[i])
				}
			}
			pooling := model.PoolSum
			if c.kind == "libsvm" && c.fmap == "" {
				pooling = model.PoolMean
			}
			mcfg := model.Config{DenseFeatures: len(samples[0].Dense), Fields: len(samples[0].Offsets) - 1, Seed: sc.Seed}
			mcfg.FieldPooling = make([]model.Pooling, mcfg.Fields)
			if c.kind != "criteo" && c.kind != "" {
				for i := range mcfg.FieldPooling {
					mcfg.FieldPooling[i] = pooling
				}
			}
			b.ReportMetric(float64(mcfg.Fields), "fields")
			b.ReportMetric(computeRate(b, mcfg, samples), "compute_samples/s")

			var trained int64
			var elapsed time.Duration
			var auc float64
			for i := range b.N {
				cfg.CheckpointDir, cfg.ShmDir = filepath.Join(b.TempDir(), fmt.Sprint(i)), b.TempDir()
				s, err := train.Run(context.Background(), cfg)
				if err != nil {
					b.Fatal(err)
				}
				trained += s.Samples
				elapsed += s.Elapsed
				auc += s.Eval.AUC
			}
			b.ReportMetric(float64(trained)/elapsed.Seconds(), "samples/s")
			b.ReportMetric(auc/float64(b.N), "test_auc")
		})
	}
}

// readAll reads every line of path through a TextSource, as a worker does, into samples (the
// trainer's: records without dense features get a constant 1).
func readAll(b *testing.B, p shard.Parser, path string) []model.Sample {
	b.Helper()
	ctx := context.Background()
	dir, name := filepath.Split(path)
	fsys := os.DirFS(dir)
	shards, err := shard.SplitText(ctx, fsys, []string{name}, shard.SplitConfig{RecordsPerShard: 4096})
	if err != nil {
		b.Fatal(err)
	}
	src := shard.TextSource{FS: fsys, Parser: p, OnError: shard.FailOnMalformed}
	var out []model.Sample
	var rec shard.Record
	for i, sh := range shards {
		sh.Index = i
		cur, err := src.Open(ctx, shard.Lease{Shard: sh})
		if err != nil {
			b.Fatal(err)
		}
		for {
			err := cur.Next(&rec)
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			s := model.Sample{Label: rec.Label, Dense: append([]float32(nil), rec.Dense...),
				IDs: append([]uint64(nil), rec.IDs...), Values: append([]float32(nil), rec.Values...)}
			if len(s.Dense) == 0 {
				s.Dense = []float32{1}
			}
			s.Offsets = append([]int32{0}, rec.FieldEnds...)
			out = append(out, s)
		}
		cur.Close()
	}
	return out
}

// computeRate measures the forward and backward pass of a model of mcfg over batches of 256 of
// samples (rows drawn at random: their values do not change the cost), in samples per second
// on one core, about one second's worth.
func computeRate(b *testing.B, mcfg model.Config, samples []model.Sample) float64 {
	b.Helper()
	m, err := model.New(mcfg)
	if err != nil {
		b.Fatal(err)
	}
	bb, err := model.NewBatchBuilder(mcfg)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	noise := make([]float32, 1<<16)
	for i := range noise {
		noise[i] = float32(r.NormFloat64()) * 0.05
	}
	var g model.Gradients
	n, next := 0, 0
	start := time.Now()
	for time.Since(start) < time.Second {
		bb.Reset()
		for range 256 {
			if err := bb.Add(&samples[next]); err != nil {
				b.Fatal(err)
			}
			next = (next + 1) % len(samples)
		}
		for rows := bb.Rows(); len(rows) > 0; {
			rows = rows[copy(rows, noise):]
		}
		if err := m.ComputeGradients(bb.Batch(), &g); err != nil {
			b.Fatal(err)
		}
		n += 256
	}
	return float64(n) / time.Since(start).Seconds()
}
