package ps_test

import (
	"context"
	"testing"

	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
)

// BenchmarkServeSmallRequests times pulls and pushes of 64 rows to one server over the in-memory
// network: small requests, where what a server does per request (its counters among it) weighs
// the most.
func BenchmarkServeSmallRequests(b *testing.B) {
	c := pstest.New(b, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	cl := c.Client("w", ps.ClientConfig{})
	ctx := context.Background()
	ids := make([]uint64, 64)
	for i := range ids {
		ids[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	dst := make([]float32, len(ids)*dim)
	g := make([]float32, len(ids)*dim)
	if err := cl.Pull(ctx, "emb", ids, dst); err != nil {
		b.Fatal(err)
	}
	b.Run("pull", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := cl.Pull(ctx, "emb", ids, dst); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("push", func(b *testing.B) {
		b.ReportAllocs()
		step := uint64(0)
		for b.Loop() {
			step++
			if err := cl.Push(ctx, "emb", ids, g, step); err != nil {
				b.Fatal(err)
			}
		}
	})
}
