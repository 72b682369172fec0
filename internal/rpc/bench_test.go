package rpc

import (
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/internal/transport"
)

// pullBytes is what a ps Pull of 4096 rows of 256 bytes returns.
const pullBytes = 4096 * 256

// benchServer serves mPull (a pullBytes response filled in place from a
// table-like slab), mPullNoFill (a pullBytes response as the pool hands it
// out, to isolate the transport) and mEcho over loopback TCP.
func benchServer(b *testing.B, cfg ServerConfig) (addr string, stop func()) {
	b.Helper()
	cfg.Secret = testSecret
	srv, err := NewServer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	slab := randomBytes(pullBytes, 3)
	_ = srv.Register(mEcho, echo)
	_ = srv.Register(mSize, func(_ context.Context, _ []byte, resp *Buffer) error {
		copy(resp.Extend(pullBytes), slab)
		return nil
	})
	_ = srv.Register(mBlock, func(_ context.Context, _ []byte, resp *Buffer) error {
		resp.Extend(pullBytes)
		return nil
	})
	l, err := (&transport.TCP{}).Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	return l.Addr().String(), func() {
		_ = srv.Close()
		<-done
	}
}

func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed))
	out := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(out[i:], rng.Uint64())
	}
	return out
}

// rawServer answers every 16-byte request with pullBytes bytes, the least a
// hand-written TCP protocol could do.
func rawServer(b *testing.B) (addr string, stop func()) {
	b.Helper()
	l, err := (&transport.TCP{}).Listen("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	payload := randomBytes(pullBytes, 4)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				req := make([]byte, 16)
				for {
					if _, err := io.ReadFull(c, req); err != nil {
						return
					}
					if _, err := c.Write(payload); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String(), func() {
		_ = l.Close()
		wg.Wait()
	}
}

// BenchmarkPull1MiB compares a 1 MiB-response call over loopback TCP with a
// raw TCP exchange of the same bytes measured in the same run. The
// "vs_raw" metric is raw time per op divided by this variant's time per op:
// 1.0 means as fast as raw TCP. rpc_unprotected, rpc (integrity, the
// default) and rpc_encrypt give the cost of frame protection.
func BenchmarkPull1MiB(b *testing.B) {
	var rawPerOp float64
	b.Run("raw_tcp", func(b *testing.B) {
		addr, stop := rawServer(b)
		defer stop()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		req := make([]byte, 16)
		buf := make([]byte, pullBytes)
		b.SetBytes(pullBytes)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := c.Write(req); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
		rawPerOp = float64(b.Elapsed()) / float64(b.N)
	})
	variants := []struct {
		name        string
		method      uint16
		compression bool
		protection  Protection
	}{
		{"rpc_unprotected", mBlock, false, ProtectNone},
		{"rpc", mBlock, false, ProtectIntegrity},
		{"rpc_encrypt", mBlock, false, ProtectEncrypt},
		{"rpc_fill", mSize, false, ProtectIntegrity},
		{"rpc_s2_incompressible", mSize, true, ProtectIntegrity},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			addr, stop := benchServer(b, ServerConfig{Compression: v.compression, Protection: v.protection})
			defer stop()
			c, err := NewClient(ClientConfig{Secret: testSecret, Compression: v.compression, Protection: v.protection})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			req := make([]byte, 16)
			// Connect both connections before timing.
			for range 2 {
				resp, err := c.Call(ctx, addr, v.method, req)
				if err != nil {
					b.Fatal(err)
				}
				c.Release(resp)
			}
			b.SetBytes(pullBytes)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				resp, err := c.Call(ctx, addr, v.method, req)
				if err != nil {
					b.Fatal(err)
				}
				if len(resp) != pullBytes {
					b.Fatalf("got %d bytes", len(resp))
				}
				c.Release(resp)
			}
			if rawPerOp > 0 {
				b.ReportMetric(rawPerOp/(float64(b.Elapsed())/float64(b.N)), "vs_raw")
			}
		})
	}
}

// BenchmarkPull1MiBCompressible measures s2 on data that compresses (a
// repeating pattern), with and without compression.
func BenchmarkPull1MiBCompressible(b *testing.B) {
	for _, comp := range []bool{false, true} {
		name := "plain"
		if comp {
			name = "s2"
		}
		b.Run(name, func(b *testing.B) {
			cfg := ServerConfig{Secret: testSecret, Compression: comp}
			srv, err := NewServer(cfg)
			if err != nil {
				b.Fatal(err)
			}
			row := make([]byte, 256)
			for i := range 64 {
				binary.LittleEndian.PutUint32(row[4*i:], uint32(i%8)<<20)
			}
			_ = srv.Register(mSize, func(_ context.Context, _ []byte, resp *Buffer) error {
				out := resp.Extend(pullBytes)
				for i := 0; i < pullBytes; i += len(row) {
					copy(out[i:], row)
				}
				return nil
			})
			l, err := (&transport.TCP{}).Listen("127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = srv.Serve(l) }()
			defer srv.Close()
			c, err := NewClient(ClientConfig{Secret: testSecret, Compression: comp})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.SetBytes(pullBytes)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				resp, err := c.Call(context.Background(), l.Addr().String(), mSize, nil)
				if err != nil {
					b.Fatal(err)
				}
				c.Release(resp)
			}
		})
	}
}

// BenchmarkPull1MiBInterleaved alternates one raw TCP exchange and one call
// per iteration, so both see the same machine conditions, and reports the
// ratio of their total times ("vs_raw", 1.0 = as fast as raw TCP) besides
// each one's time per op.
func BenchmarkPull1MiBInterleaved(b *testing.B) {
	rawAddr, stopRaw := rawServer(b)
	defer stopRaw()
	raw, err := net.Dial("tcp", rawAddr)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	addr, stop := benchServer(b, ServerConfig{})
	defer stop()
	c, err := NewClient(ClientConfig{Secret: testSecret})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	req := make([]byte, 16)
	buf := make([]byte, pullBytes)
	for range 2 {
		resp, err := c.Call(ctx, addr, mSize, req)
		if err != nil {
			b.Fatal(err)
		}
		c.Release(resp)
	}
	var rawTime, rpcTime time.Duration
	b.SetBytes(2 * pullBytes)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := raw.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(raw, buf); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		resp, err := c.Call(ctx, addr, mSize, req)
		if err != nil {
			b.Fatal(err)
		}
		c.Release(resp)
		rawTime += t1.Sub(t0)
		rpcTime += time.Since(t1)
	}
	b.ReportMetric(float64(rawTime.Nanoseconds())/float64(b.N), "raw_ns/op")
	b.ReportMetric(float64(rpcTime.Nanoseconds())/float64(b.N), "rpc_ns/op")
	b.ReportMetric(float64(rawTime)/float64(rpcTime), "vs_raw")
}

// BenchmarkSmallCall measures per-call overhead: a 64-byte echo, against a
// raw TCP 64-byte ping-pong, one caller and many in parallel.
func BenchmarkSmallCall(b *testing.B) {
	addr, stop := benchServer(b, ServerConfig{})
	defer stop()
	c, err := NewClient(ClientConfig{Secret: testSecret})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	req := make([]byte, 64)
	var rawPerOp float64
	b.Run("raw_tcp", func(b *testing.B) {
		l, err := (&transport.TCP{}).Listen("127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			s, err := l.Accept()
			if err != nil {
				return
			}
			defer s.Close()
			_, _ = io.Copy(s, s)
		}()
		conn, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 64)
		b.ResetTimer()
		for range b.N {
			if _, err := conn.Write(req); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(conn, buf); err != nil {
				b.Fatal(err)
			}
		}
		rawPerOp = float64(b.Elapsed()) / float64(b.N)
		_ = conn.Close()
		_ = l.Close()
		<-done
	})
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			resp, err := c.Call(context.Background(), addr, mEcho, req)
			if err != nil {
				b.Fatal(err)
			}
			c.Release(resp)
		}
		if rawPerOp > 0 {
			b.ReportMetric(rawPerOp/(float64(b.Elapsed())/float64(b.N)), "vs_raw")
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := c.Call(context.Background(), addr, mEcho, req)
				if err != nil {
					b.Error(err)
					return
				}
				c.Release(resp)
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
	})
}
