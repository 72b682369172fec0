package train

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkOverlapCheck times the overlap check on MovieLens ratings (ml-latest-small's 100 836
// by default, DLRM_MOVIELENS names another directory) split 80/20 at random, against the
// baseline of loading the data (reading and parsing every rating once, the held-out ones turned
// into samples): per training record, and as a ratio to the load. Its allocations are those of
// the test records' table.
func BenchmarkOverlapCheck(b *testing.B) {
	dir := os.Getenv("DLRM_MOVIELENS")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "..", "shared", "data", "movielens-latest-small")
	}
	if _, err := os.Stat(dir); err != nil {
		b.Skipf("MovieLens data not found at %s (DLRM_MOVIELENS names a directory): %v", dir, err)
	}
	spec, err := ParseDataSpec("movielens:" + dir)
	if err != nil {
		b.Fatal(err)
	}
	cfg := Config{Data: spec, CheckpointDir: b.TempDir()}
	cfg.fill()
	ctx := context.Background()
	start := time.Now()
	d, err := loadData(ctx, &cfg)
	if err != nil {
		b.Fatal(err)
	}
	load := time.Since(start)
	var o *Overlap
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if o, err = checkOverlap(ctx, d.trainRecs, d.testRecs, d.split); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	per := b.Elapsed() / time.Duration(b.N)
	nTrain := int(d.dataset.Records)
	b.ReportMetric(float64(per.Nanoseconds())/float64(nTrain), "ns/train-record")
	b.ReportMetric(per.Seconds()/load.Seconds(), "check/load")
	b.ReportMetric(float64(o.Of), "test-records")
	b.ReportMetric(float64(o.Records), "overlap")
}
