package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
)

// runShard measures the data-shard dispatcher served over loopback TCP (shardnet server and
// clients) against the same calls on the in-process Dispatcher: get-shard + report-done round
// trips with 8 concurrent workers, and the cost of progress reports per record at batch 512.
func runShard(ctx context.Context, opt options, r *report) error {
	const workers, batch = 8, 512
	shards, reports, rounds := 100_000, 4000, 3
	if opt.quick {
		shards, reports, rounds = 8000, 400, 1
	}
	secret := make([]byte, 32)
	rand.Read(secret)

	var tcpRates, sharedRates, inRates, rawRates, tcpReport, inReport []float64
	var tcpLat []time.Duration
	for round := 0; round < rounds; round++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rate, lat, err := shardDispatchTCP(ctx, secret, workers, shards, false)
		if err != nil {
			return fmt.Errorf("dispatch over TCP: %w", err)
		}
		tcpRates, tcpLat = append(tcpRates, rate), append(tcpLat, lat...)
		rate, _, err = shardDispatchTCP(ctx, secret, workers, shards, true)
		if err != nil {
			return fmt.Errorf("dispatch over TCP, one client: %w", err)
		}
		sharedRates = append(sharedRates, rate)
		rate, _, err = shardDispatch(ctx, workers, shards, func(d *shard.Dispatcher) (func(int) shard.Service, func(), error) {
			return func(int) shard.Service { return d }, func() {}, nil
		})
		if err != nil {
			return fmt.Errorf("dispatch in process: %w", err)
		}
		inRates = append(inRates, rate)
		rate, err = shardRawTCP(ctx, workers, shards)
		if err != nil {
			return fmt.Errorf("raw TCP: %w", err)
		}
		rawRates = append(rawRates, rate)

		ns, err := shardReportTCP(ctx, secret, batch, reports)
		if err != nil {
			return fmt.Errorf("reports over TCP: %w", err)
		}
		tcpReport = append(tcpReport, ns)
		ns, err = shardReportCost(ctx, batch, reports, func(d *shard.Dispatcher) (shard.Service, func(), error) { return d, func() {}, nil })
		if err != nil {
			return fmt.Errorf("reports in process: %w", err)
		}
		inReport = append(inReport, ns)
	}
	tcp, in, raw := shardMedian(tcpRates), shardMedian(inRates), shardMedian(rawRates)
	slices.Sort(tcpLat)
	r.add("dispatch_per_s", tcp, fmt.Sprintf("acquire + report-done round trips/s, %d workers (a client each) over loopback TCP to one server; target >= 20000; baselines: in process and raw TCP below", workers))
	r.add("dispatch_one_client_per_s", shardMedian(sharedRates), fmt.Sprintf("the same %d workers sharing one client (one process, one connection): concurrent calls share writes", workers))
	r.add("dispatch_inproc_per_s", in, "the same round trips on the in-process Dispatcher (baseline, no network)")
	r.add("dispatch_tcp_vs_inproc", tcp/in, "TCP / in process: the share of dispatcher speed left after the network")
	r.add("raw_tcp_pairs_per_s", raw, fmt.Sprintf("physical limit: pairs of 64-byte ping-pongs/s, %d goroutines on their own loopback TCP connections to an echo server", workers))
	r.add("dispatch_vs_raw_tcp", tcp/raw, "dispatch round trips / raw ping-pong pairs: what the RPC stack and dispatcher keep of the machine's loopback speed")
	r.add("dispatch_p50_us", shardMicros(tcpLat, 0.50), "median round trip (acquire + report) over TCP under the same load, µs")
	r.add("dispatch_p99_us", shardMicros(tcpLat, 0.99), "99th percentile round trip over TCP, µs")
	rep, inRep := shardMedian(tcpReport), shardMedian(inReport)
	r.add("report_overhead_per_record_ns", rep, fmt.Sprintf("ns of Report calls per record covered, one report per %d-record batch over TCP, one worker; target <= 500 (a report round trip under 256 µs); baseline: in process below", batch))
	r.add("report_overhead_per_record_inproc_ns", inRep, "the same in process (baseline)")
	r.add("report_rtt_us", rep*batch/1e3, "mean Report round trip over TCP, µs")
	return nil
}

// shardServe serves d on a loopback TCP port and returns its address and a stop function.
func shardServe(d *shard.Dispatcher, secret []byte) (string, func(), error) {
	srv, err := shardnet.NewServer(shardnet.ServerConfig{Service: d, Secret: secret})
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	return l.Addr().String(), func() { _ = srv.Close(); <-done }, nil
}

// shardDispatchTCP runs shardDispatch with a shardnet client per worker (or one client shared
// by all workers), each connected (one Leave call) before the clock starts.
func shardDispatchTCP(ctx context.Context, secret []byte, workers, shards int, shared bool) (float64, []time.Duration, error) {
	return shardDispatch(ctx, workers, shards, func(d *shard.Dispatcher) (func(int) shard.Service, func(), error) {
		addr, stop, err := shardServe(d, secret)
		if err != nil {
			return nil, nil, err
		}
		n := workers
		if shared {
			n = 1
		}
		clients := make([]*shardnet.Client, n)
		closeAll := func() {
			for _, c := range clients {
				if c != nil {
					_ = c.Close()
				}
			}
			stop()
		}
		for w := range clients {
			c, err := shardnet.NewClient(shardnet.ClientConfig{Addr: addr, Secret: secret})
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			clients[w] = c
			if err := c.Leave(ctx, shardWorker(w)); err != nil {
				closeAll()
				return nil, nil, err
			}
		}
		return func(w int) shard.Service { return clients[w%n] }, closeAll, nil
	})
}

// shardRawTCP measures the machine's floor for the same traffic pattern: workers goroutines,
// each on its own loopback TCP connection to an echo server, doing pairs of 64-byte
// request/response exchanges (as a dispatch round trip is two calls), pairs times in all.
func shardRawTCP(ctx context.Context, workers, pairs int) (float64, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	var servers sync.WaitGroup
	defer servers.Wait()
	conns := make([]net.Conn, workers)
	for w := range conns {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return 0, err
		}
		defer c.Close()
		conns[w] = c
		s, err := l.Accept()
		if err != nil {
			return 0, err
		}
		servers.Go(func() {
			defer s.Close()
			buf := make([]byte, 64)
			for {
				if _, err := io.ReadFull(s, buf); err != nil {
					return
				}
				if _, err := s.Write(buf); err != nil {
					return
				}
			}
		})
	}
	var next atomic.Int64
	errs := make([]error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w, c := range conns {
		wg.Go(func() {
			buf := make([]byte, 64)
			for next.Add(1) <= int64(pairs) && ctx.Err() == nil {
				for range 2 {
					if _, err := c.Write(buf); err != nil {
						errs[w] = err
						return
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						errs[w] = err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, c := range conns {
		_ = c.Close()
	}
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return 0, err
	}
	return float64(pairs) / elapsed.Seconds(), nil
}

func shardWorker(w int) string { return fmt.Sprintf("worker-%d", w) }

// shardDispatch builds a dispatcher of shards one-record shards, lets workers goroutines take
// them through the services setup returns (acquire, then report the shard done) until none is
// left, and returns round trips per second and the latency of each.
func shardDispatch(ctx context.Context, workers, shards int, setup func(*shard.Dispatcher) (func(int) shard.Service, func(), error)) (float64, []time.Duration, error) {
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(int64(shards)), ShardSize: 1, RetryAfter: time.Millisecond})
	if err != nil {
		return 0, nil, err
	}
	svc, stop, err := setup(d)
	if err != nil {
		return 0, nil, err
	}
	defer stop()
	runtime.GC()
	lat := make([][]time.Duration, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			s, name := svc(w), shardWorker(w)
			lat[w] = make([]time.Duration, 0, 2*shards/workers)
			for {
				t0 := time.Now()
				l, err := s.Acquire(ctx, name)
				if errors.Is(err, shard.ErrNoMoreWork) {
					return
				}
				if errors.Is(err, shard.ErrWait) { // the last shards are held by others
					runtime.Gosched()
					continue
				}
				if err == nil {
					err = s.Report(ctx, name, l.ID, l.Shard.Records, true)
				}
				if err != nil {
					errs[w] = err
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, nil, err
	}
	if p := d.Progress(); !p.Finished || p.EpochRecords[0].Done != int64(shards) {
		return 0, nil, fmt.Errorf("dispatcher not finished: %+v", p.EpochRecords)
	}
	return float64(shards) / elapsed.Seconds(), slices.Concat(lat...), nil
}

// shardReportTCP runs shardReportCost through a shardnet client on loopback TCP.
func shardReportTCP(ctx context.Context, secret []byte, batch, reports int) (float64, error) {
	return shardReportCost(ctx, batch, reports, func(d *shard.Dispatcher) (shard.Service, func(), error) {
		addr, stop, err := shardServe(d, secret)
		if err != nil {
			return nil, nil, err
		}
		c, err := shardnet.NewClient(shardnet.ClientConfig{Addr: addr, Secret: secret})
		if err != nil {
			stop()
			return nil, nil, err
		}
		return c, func() { _ = c.Close(); stop() }, nil
	})
}

// shardReportCost leases one shard of reports*batch records to one worker, reports progress
// after every batch, and returns the time spent in Report per record covered, in ns.
func shardReportCost(ctx context.Context, batch, reports int, setup func(*shard.Dispatcher) (shard.Service, func(), error)) (float64, error) {
	records := int64(batch * reports)
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(records), ShardSize: records})
	if err != nil {
		return 0, err
	}
	svc, stop, err := setup(d)
	if err != nil {
		return 0, err
	}
	defer stop()
	l, err := svc.Acquire(ctx, "worker")
	if err != nil {
		return 0, err
	}
	runtime.GC()
	var spent time.Duration
	for off := int64(batch); off <= records; off += int64(batch) {
		t0 := time.Now()
		if err := svc.Report(ctx, "worker", l.ID, off, off == records); err != nil {
			return 0, err
		}
		spent += time.Since(t0)
	}
	if p := d.Progress(); !p.Finished {
		return 0, errors.New("shard not finished")
	}
	return float64(spent.Nanoseconds()) / float64(records), nil
}

func shardMedian(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// shardMicros returns quantile q of sorted durations, in µs.
func shardMicros(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(q*float64(len(sorted)-1))].Nanoseconds()) / 1e3
}
