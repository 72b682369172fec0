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
// clients) against the same calls on the in-process Dispatcher and against raw TCP ping-pongs:
// what a worker does per shard (report it done and get the next lease, with the combined call
// ReportAndAcquire: one RPC per shard), the same with two calls (Report, then Acquire), both
// with 8 concurrent workers, and the cost of progress reports per record at batch 512.
func runShard(ctx context.Context, opt options, r *report) error {
	const workers, batch = 8, 512
	shards, reports, rounds := 100_000, 4000, 3
	if opt.quick {
		shards, reports, rounds = 8000, 400, 1
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	inProcess := func(d *shard.Dispatcher) (func(int) shard.Service, func(), error) {
		return func(int) shard.Service { return d }, func() {}, nil
	}

	var tcpRates, twoRates, sharedRates, inRates, inTwoRates, rawRates, rawPairRates, tcpReport, inReport []float64
	var tcpLat, twoLat []time.Duration
	var calls, twoCalls int64
	for round := 0; round < rounds; round++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		res, err := shardDispatchTCP(ctx, secret, workers, shards, true, false)
		if err != nil {
			return fmt.Errorf("dispatch over TCP: %w", err)
		}
		tcpRates, tcpLat, calls = append(tcpRates, res.rate), append(tcpLat, res.lat...), calls+res.calls
		res, err = shardDispatchTCP(ctx, secret, workers, shards, false, false)
		if err != nil {
			return fmt.Errorf("dispatch over TCP, two calls: %w", err)
		}
		twoRates, twoLat, twoCalls = append(twoRates, res.rate), append(twoLat, res.lat...), twoCalls+res.calls
		res, err = shardDispatchTCP(ctx, secret, workers, shards, true, true)
		if err != nil {
			return fmt.Errorf("dispatch over TCP, one client: %w", err)
		}
		sharedRates = append(sharedRates, res.rate)
		res, err = shardDispatch(ctx, workers, shards, true, inProcess)
		if err != nil {
			return fmt.Errorf("dispatch in process: %w", err)
		}
		inRates = append(inRates, res.rate)
		res, err = shardDispatch(ctx, workers, shards, false, inProcess)
		if err != nil {
			return fmt.Errorf("dispatch in process, two calls: %w", err)
		}
		inTwoRates = append(inTwoRates, res.rate)
		rate, err := shardRawTCP(ctx, workers, shards, 1)
		if err != nil {
			return fmt.Errorf("raw TCP: %w", err)
		}
		rawRates = append(rawRates, rate)
		rate, err = shardRawTCP(ctx, workers, shards, 2)
		if err != nil {
			return fmt.Errorf("raw TCP pairs: %w", err)
		}
		rawPairRates = append(rawPairRates, rate)

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
	tcp, two, in, raw, rawPairs := shardMedian(tcpRates), shardMedian(twoRates), shardMedian(inRates), shardMedian(rawRates), shardMedian(rawPairRates)
	slices.Sort(tcpLat)
	slices.Sort(twoLat)
	rpcs, twoRPCs := float64(calls)/float64(rounds*shards), float64(twoCalls)/float64(rounds*shards)
	r.add("dispatch_per_s", tcp, fmt.Sprintf("shards/s through report-done + next lease, the combined call ReportAndAcquire (%.2f RPCs per shard), %d workers (a client each) over loopback TCP to one server; target >= 20000; baselines: two calls, in process and raw TCP below", rpcs, workers))
	r.add("dispatch_rpcs_per_shard", rpcs, "RPCs a worker made per shard in dispatch_per_s (an Acquire only when a combined call found no shard free)")
	r.add("dispatch_two_calls_per_s", two, fmt.Sprintf("the same with two calls per shard (Acquire, then Report(done); %.2f RPCs per shard), %d workers over loopback TCP (the figure before the combined call)", twoRPCs, workers))
	r.add("dispatch_combined_vs_two_calls", tcp/two, "dispatch_per_s / dispatch_two_calls_per_s")
	r.add("dispatch_one_client_per_s", shardMedian(sharedRates), fmt.Sprintf("the combined call with the same %d workers sharing one client (one process, one connection): concurrent calls share writes", workers))
	r.add("dispatch_inproc_per_s", in, "the combined call on the in-process Dispatcher (baseline, no network)")
	r.add("dispatch_inproc_two_calls_per_s", shardMedian(inTwoRates), "two calls per shard on the in-process Dispatcher")
	r.add("dispatch_tcp_vs_inproc", tcp/in, "dispatch_per_s / dispatch_inproc_per_s: the share of dispatcher speed left after the network")
	r.add("raw_tcp_pingpongs_per_s", raw, fmt.Sprintf("physical limit for one RPC per shard: 64-byte ping-pongs/s, %d goroutines on their own loopback TCP connections to an echo server", workers))
	r.add("raw_tcp_pairs_per_s", rawPairs, "physical limit for two RPCs per shard: pairs of the same ping-pongs/s")
	r.add("dispatch_vs_raw_tcp", tcp/raw, "dispatch_per_s / raw_tcp_pingpongs_per_s: what the RPC stack and dispatcher keep of the machine's loopback speed")
	r.add("dispatch_two_calls_vs_raw_pairs", two/rawPairs, "dispatch_two_calls_per_s / raw_tcp_pairs_per_s")
	r.add("dispatch_p50_us", shardMicros(tcpLat, 0.50), "median time per shard (the combined call) over TCP under the same load, µs")
	r.add("dispatch_p99_us", shardMicros(tcpLat, 0.99), "99th percentile time per shard (the combined call) over TCP, µs")
	r.add("dispatch_two_calls_p50_us", shardMicros(twoLat, 0.50), "median time per shard with two calls (Acquire + Report) over TCP, µs")
	r.add("dispatch_two_calls_p99_us", shardMicros(twoLat, 0.99), "99th percentile time per shard with two calls over TCP, µs")
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
func shardDispatchTCP(ctx context.Context, secret []byte, workers, shards int, combined, shared bool) (dispatchResult, error) {
	return shardDispatch(ctx, workers, shards, combined, func(d *shard.Dispatcher) (func(int) shard.Service, func(), error) {
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
// each on its own loopback TCP connection to an echo server, doing groups of exchanges 64-byte
// request/response exchanges (one per RPC a shard costs), groups times in all. It returns
// groups per second.
func shardRawTCP(ctx context.Context, workers, groups, exchanges int) (float64, error) {
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
			for next.Add(1) <= int64(groups) && ctx.Err() == nil {
				for range exchanges {
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
	return float64(groups) / elapsed.Seconds(), nil
}

func shardWorker(w int) string { return fmt.Sprintf("worker-%d", w) }

// dispatchResult is what shardDispatch measured.
type dispatchResult struct {
	rate  float64         // shards per second
	lat   []time.Duration // time spent on each shard's calls
	calls int64           // dispatcher calls made
}

// shardDispatch builds a dispatcher of shards one-record shards and lets workers goroutines take
// them through the services setup returns until none is left: with combined, each shard is
// reported done with ReportAndAcquire, which brings the next lease (Acquire only when it found
// no shard free); otherwise each shard is an Acquire and then a Report(done).
func shardDispatch(ctx context.Context, workers, shards int, combined bool, setup func(*shard.Dispatcher) (func(int) shard.Service, func(), error)) (dispatchResult, error) {
	d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(int64(shards)), ShardSize: 1, RetryAfter: time.Millisecond})
	if err != nil {
		return dispatchResult{}, err
	}
	svc, stop, err := setup(d)
	if err != nil {
		return dispatchResult{}, err
	}
	defer stop()
	runtime.GC()
	lat := make([][]time.Duration, workers)
	calls := make([]int64, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			s, name := svc(w), shardWorker(w)
			lat[w] = make([]time.Duration, 0, 2*shards/workers)
			if combined {
				errs[w] = shardCombinedWorker(ctx, s, name, &lat[w], &calls[w])
				return
			}
			for {
				t0 := time.Now()
				l, err := s.Acquire(ctx, name)
				calls[w]++
				if errors.Is(err, shard.ErrNoMoreWork) {
					return
				}
				if errors.Is(err, shard.ErrWait) { // the last shards are held by others
					runtime.Gosched()
					continue
				}
				if err == nil {
					err = s.Report(ctx, name, l.ID, l.Shard.Records, true)
					calls[w]++
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
		return dispatchResult{}, err
	}
	if p := d.Progress(); !p.Finished || p.EpochRecords[0].Done != int64(shards) {
		return dispatchResult{}, fmt.Errorf("dispatcher not finished: %+v", p.EpochRecords)
	}
	var n int64
	for _, c := range calls {
		n += c
	}
	return dispatchResult{rate: float64(shards) / elapsed.Seconds(), lat: slices.Concat(lat...), calls: n}, nil
}

// shardCombinedWorker is one worker of shardDispatch with the combined call: it holds a lease,
// reports it done and gets the next in one call, and acquires only when it holds none.
func shardCombinedWorker(ctx context.Context, s shard.Service, name string, lat *[]time.Duration, calls *int64) error {
	ra, ok := s.(shard.ReportAcquirer)
	if !ok {
		return fmt.Errorf("%T has no combined call", s)
	}
	var l shard.Lease
	have := false
	for {
		t0 := time.Now()
		if !have {
			var err error
			l, err = s.Acquire(ctx, name)
			*calls++
			switch {
			case errors.Is(err, shard.ErrNoMoreWork):
				return nil
			case errors.Is(err, shard.ErrWait): // the last shards are held by others
				runtime.Gosched()
				continue
			case err != nil:
				return err
			}
		}
		next, err := ra.ReportAndAcquire(ctx, name, l.ID, l.Shard.Records)
		*calls++
		*lat = append(*lat, time.Since(t0))
		switch {
		case err == nil:
			l, have = next, true
		case errors.Is(err, shard.ErrNoMoreWork): // l is done, and so is the job
			return nil
		case errors.Is(err, shard.ErrWait): // l is done; no shard is free right now
			have = false
			runtime.Gosched()
		default:
			return err
		}
	}
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
