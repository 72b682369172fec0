package shardnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardwire"
)

// benchDispatch serves a dispatcher of one-record shards on loopback TCP and runs 8 workers
// that each acquire a shard and report it done through call until none is left; it reports
// round trips per second.
func benchDispatch(b *testing.B, call func(ctx context.Context, addr string, w int) (func() (bool, error), func())) {
	const workers = 8
	shards := max(b.N, 1000)
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(int64(shards)), ShardSize: 1, RetryAfter: time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := NewServer(ServerConfig{Service: d, Secret: testSecret})
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	defer func() { _ = srv.Close(); <-done }()
	ctx := context.Background()
	steps := make([]func() (bool, error), workers)
	for w := range steps {
		step, stop := call(ctx, l.Addr().String(), w)
		defer stop()
		steps[w] = step
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for {
				more, err := steps[w]()
				if err != nil {
					b.Error(err)
					return
				}
				if !more {
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(shards)/b.Elapsed().Seconds(), "roundtrips/s")
}

// BenchmarkDispatchTCP compares the Client with bare RPC calls carrying the same encodings:
// the difference is the Client's own cost. "combined" finishes each shard with one
// ReportAndAcquire instead of a Report and an Acquire.
func BenchmarkDispatchTCP(b *testing.B) {
	b.Run("combined", func(b *testing.B) {
		benchDispatch(b, func(ctx context.Context, addr string, w int) (func() (bool, error), func()) {
			c, err := NewClient(ClientConfig{Addr: addr, Secret: testSecret})
			if err != nil {
				b.Fatal(err)
			}
			name := fmt.Sprint("w", w)
			if err := c.Leave(ctx, name); err != nil {
				b.Fatal(err)
			}
			var l shard.Lease
			have := false
			return func() (bool, error) {
				if !have {
					var err error
					l, err = c.Acquire(ctx, name)
					switch {
					case errors.Is(err, shard.ErrNoMoreWork):
						return false, nil
					case errors.Is(err, shard.ErrWait):
						return true, nil
					case err != nil:
						return false, err
					}
				}
				next, err := c.ReportAndAcquire(ctx, name, l.ID, l.Shard.Records)
				switch {
				case errors.Is(err, shard.ErrNoMoreWork):
					return false, nil
				case errors.Is(err, shard.ErrWait):
					have = false
					return true, nil
				case err != nil:
					return false, err
				}
				l, have = next, true
				return true, nil
			}, func() { _ = c.Close() }
		})
	})
	b.Run("client", func(b *testing.B) {
		benchDispatch(b, func(ctx context.Context, addr string, w int) (func() (bool, error), func()) {
			c, err := NewClient(ClientConfig{Addr: addr, Secret: testSecret})
			if err != nil {
				b.Fatal(err)
			}
			name := fmt.Sprint("w", w)
			if err := c.Leave(ctx, name); err != nil {
				b.Fatal(err)
			}
			return func() (bool, error) {
				l, err := c.Acquire(ctx, name)
				switch {
				case errors.Is(err, shard.ErrNoMoreWork):
					return false, nil
				case errors.Is(err, shard.ErrWait):
					return true, nil
				case err != nil:
					return false, err
				}
				return true, c.Report(ctx, name, l.ID, l.Shard.Records, true)
			}, func() { _ = c.Close() }
		})
	})
	b.Run("rpc", func(b *testing.B) {
		benchDispatch(b, func(ctx context.Context, addr string, w int) (func() (bool, error), func()) {
			c, err := rpc.NewClient(rpc.ClientConfig{Secret: testSecret, ConnsPerAddr: 1})
			if err != nil {
				b.Fatal(err)
			}
			name := fmt.Sprint("w", w)
			if _, err := c.Call(ctx, addr, methodLeave, shardwire.AppendLeaveRequest(nil, shardwire.LeaveRequest{Worker: name})); err != nil {
				b.Fatal(err)
			}
			var req []byte
			return func() (bool, error) {
				req = shardwire.AppendAcquireRequest(req[:0], shardwire.AcquireRequest{Worker: name})
				resp, err := c.Call(ctx, addr, methodAcquire, req)
				if err != nil {
					return false, err
				}
				r, _, err := shardwire.DecodeAcquireResponse(resp)
				c.Release(resp)
				if err != nil {
					return false, err
				}
				l, err := r.Result()
				switch {
				case errors.Is(err, shard.ErrNoMoreWork):
					return false, nil
				case errors.Is(err, shard.ErrWait):
					return true, nil
				case err != nil:
					return false, err
				}
				req = shardwire.AppendReportRequest(req[:0], shardwire.ReportRequest{Worker: name, Lease: l.ID, Offset: l.Shard.Records, Done: true})
				resp, err = c.Call(ctx, addr, methodReport, req)
				if err != nil {
					return false, err
				}
				st, _, err := shardwire.DecodeStatus(resp)
				c.Release(resp)
				if err != nil {
					return false, err
				}
				return true, st.Err()
			}, func() { _ = c.Close() }
		})
	})
}
