package shardnet_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
	"github.com/elasticps/elasticps/shard/shardwire"
)

func TestErrorsCrossTheWire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := memnet.New(memnet.Config{})
		d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(10), ShardSize: 10, RetryAfter: 3 * time.Second, Incarnation: 5})
		if err != nil {
			t.Fatal(err)
		}
		s := serve(t, nw, "coord", "coord:1", d)
		defer s.stop()
		cli := newClient(t, nw, "w", "coord:1", time.Second)
		defer cli.Close()
		ctx := context.Background()

		l, err := cli.Acquire(ctx, "a")
		if err != nil || l.ID.Incarnation != 5 || l.Shard.Records != 10 || l.TTL != 30*time.Second {
			t.Fatalf("acquire: %+v, %v", l, err)
		}
		_, err = cli.Acquire(ctx, "b")
		var we *shard.WaitError
		if !errors.As(err, &we) || we.RetryAfter != 3*time.Second || !errors.Is(err, shard.ErrWait) {
			t.Fatalf("wait: %v", err)
		}
		if err := cli.Report(ctx, "b", l.ID, 1, false); !errors.Is(err, shard.ErrStaleLease) {
			t.Fatalf("stale: %v", err)
		}
		if err := cli.Report(ctx, "a", l.ID, 11, false); !errors.Is(err, shard.ErrBadOffset) {
			t.Fatalf("offset: %v", err)
		}
		for _, w := range []string{"", strings.Repeat("w", shard.MaxWorkerName+1)} {
			if _, err := cli.Acquire(ctx, w); !errors.Is(err, shard.ErrBadWorker) {
				t.Fatalf("worker %q: %v", w, err)
			}
			if err := cli.Leave(ctx, w); !errors.Is(err, shard.ErrBadWorker) {
				t.Fatalf("worker %q: %v", w, err)
			}
		}
		if _, err := cli.ReportAndAcquire(ctx, "b", l.ID, 10); !errors.Is(err, shard.ErrStaleLease) {
			t.Fatalf("combined, stale: %v", err)
		}
		if _, err := cli.ReportAndAcquire(ctx, "a", l.ID, 9); !errors.Is(err, shard.ErrBadOffset) {
			t.Fatalf("combined, offset: %v", err)
		}
		if _, err := cli.ReportAndAcquire(ctx, "", l.ID, 10); !errors.Is(err, shard.ErrBadWorker) {
			t.Fatalf("combined, worker: %v", err)
		}
		if _, err := cli.ReportAndAcquire(ctx, "a", l.ID, 10); !errors.Is(err, shard.ErrNoMoreWork) {
			t.Fatalf("combined, no more work: %v", err)
		}
		if err := cli.Report(ctx, "a", l.ID, 10, true); !errors.Is(err, shard.ErrStaleLease) {
			t.Fatalf("report after the combined call: %v", err)
		}
		if _, err := cli.Acquire(ctx, "a"); !errors.Is(err, shard.ErrNoMoreWork) {
			t.Fatalf("no more work: %v", err)
		}
		if err := cli.Leave(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		st := s.srv.Stats()
		if st.Acquires != 3 || st.Reports != 3 || st.Leaves != 1 || st.ReportAcquires != 3 || st.Malformed != 0 {
			t.Fatalf("stats %+v", st)
		}
		if p := d.Progress(); !p.Finished || p.EpochRecords[0].Done != 10 {
			t.Fatalf("progress %+v", p)
		}

		// A server whose service has no combined call says so.
		plain := serve(t, nw, "plain", "plain:1", struct{ shard.Service }{d})
		defer plain.stop()
		pc := newClient(t, nw, "w", "plain:1", time.Second)
		defer pc.Close()
		if _, err := pc.ReportAndAcquire(ctx, "a", l.ID, 10); !errors.Is(err, errors.ErrUnsupported) || errors.Is(err, shard.ErrPermanent) {
			t.Fatalf("combined call without support: %v", err)
		}
	})
}

// failing is a Service whose every call returns err.
type failing struct{ err error }

func (f failing) Acquire(context.Context, string) (shard.Lease, error) { return shard.Lease{}, f.err }
func (f failing) Report(context.Context, string, shard.LeaseID, int64, bool) error {
	return f.err
}
func (f failing) Leave(context.Context, string) error { return f.err }
func (f failing) ReportAndAcquire(context.Context, string, shard.LeaseID, int64) (shard.Lease, error) {
	return shard.Lease{}, f.err
}

func TestServiceFailuresAreRetryable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := memnet.New(memnet.Config{})
		fire := serve(t, nw, "a", "a:1", failing{errors.New("disk on fire")})
		defer fire.stop()
		cancelled := serve(t, nw, "b", "b:1", failing{context.Canceled})
		defer cancelled.stop()
		ctx := context.Background()
		for _, tc := range []struct {
			addr string
			want error
		}{{"a:1", shardwire.ErrRemote}, {"b:1", shardnet.ErrUnavailable}} {
			cli := newClient(t, nw, "w", tc.addr, time.Second)
			_, err := cli.Acquire(ctx, "w")
			_, raErr := cli.ReportAndAcquire(ctx, "w", shard.LeaseID{Seq: 1}, 1)
			errs := []error{err, cli.Report(ctx, "w", shard.LeaseID{Seq: 1}, 1, false), cli.Leave(ctx, "w"), raErr}
			for i, err := range errs {
				if !errors.Is(err, tc.want) || errors.Is(err, shard.ErrPermanent) || errors.Is(err, context.Canceled) {
					t.Errorf("%s call %d: %v, want %v", tc.addr, i, err, tc.want)
				}
			}
			_ = cli.Close()
		}
	})
}

func TestWrongSecretRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := memnet.New(memnet.Config{})
		d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 10})
		if err != nil {
			t.Fatal(err)
		}
		s := serve(t, nw, "coord", "coord:1", d)
		defer s.stop()
		ctx := context.Background()
		good := newClient(t, nw, "good", "coord:1", time.Second)
		defer good.Close()
		l, err := good.Acquire(ctx, "good")
		if err != nil {
			t.Fatal(err)
		}

		intruder, err := shardnet.NewClient(shardnet.ClientConfig{Addr: "coord:1", Secret: []byte("a guessed secret of 32 bytes...."), Transport: nw.Host("intruder")})
		if err != nil {
			t.Fatal(err)
		}
		defer intruder.Close()
		if _, err := intruder.Acquire(ctx, "intruder"); !errors.Is(err, shardnet.ErrAuth) || !errors.Is(err, shard.ErrPermanent) {
			t.Fatalf("acquire with a wrong secret: %v", err)
		}
		if err := intruder.Report(ctx, "good", l.ID, 10, true); !errors.Is(err, shardnet.ErrAuth) {
			t.Fatalf("report with a wrong secret: %v", err)
		}
		// A Reader gives up at once instead of retrying forever.
		r, err := shard.NewReader(shard.ReaderConfig{Service: intruder, Worker: "intruder", Source: shard.IndexedSource{Data: labelled(100)}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Next(ctx); !errors.Is(err, shardnet.ErrAuth) || r.Stats().Retries != 0 {
			t.Fatalf("reader: %v after %d retries", err, r.Stats().Retries)
		}
		// A server that does not know the secret cannot fool a client either.
		impostor := serve(t, nw, "impostor", "impostor:1", d)
		defer impostor.stop()
		fooled, err := shardnet.NewClient(shardnet.ClientConfig{Addr: "impostor:1", Secret: []byte("the real one? no: 32 other bytes"), Transport: nw.Host("w")})
		if err != nil {
			t.Fatal(err)
		}
		defer fooled.Close()
		if _, err := fooled.Acquire(ctx, "w"); !errors.Is(err, shardnet.ErrAuth) {
			t.Fatalf("impostor: %v", err)
		}
		// Nothing reached the dispatcher, and the good client carries on.
		if err := good.Report(ctx, "good", l.ID, 10, true); err != nil {
			t.Fatal(err)
		}
		if p := d.Progress(); p.EpochRecords[0].Done != 10 || p.Leases != 1 {
			t.Fatalf("progress %+v", p)
		}
	})
}

// TestLateAcquireAnswerIsNotLost cuts a worker off while it asks for a shard: its Acquire calls
// time out, but the request stays outstanding, so after the partition heals the dispatcher has
// granted one lease, not one per retry, and the worker's next Acquire returns exactly that one.
func TestLateAcquireAnswerIsNotLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 10 * time.Second
		nw := memnet.New(memnet.Config{})
		d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(1000), ShardSize: 100, LeaseTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		s := serve(t, nw, "coord", "coord:1", d)
		defer s.stop()
		cli := newClient(t, nw, "w", "coord:1", time.Second)
		defer cli.Close()
		ctx := context.Background()
		if err := cli.Leave(ctx, "w"); err != nil { // connect
			t.Fatal(err)
		}

		nw.Partition("w", "coord")
		for range 3 {
			if _, err := cli.Acquire(ctx, "w"); !errors.Is(err, shardnet.ErrUnavailable) {
				t.Fatalf("partitioned acquire: %v", err)
			}
		}
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		if _, err := cli.Acquire(short, "w"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("acquire past its context: %v", err)
		}
		cancel()
		if p := d.Progress(); p.Leases != 0 {
			t.Fatalf("%d leases granted through a partition", p.Leases)
		}
		nw.Heal("w", "coord")
		synctest.Wait() // the held request is delivered and answered
		if p := d.Progress(); p.Leases != 1 {
			t.Fatalf("%d leases granted after the partition healed, want 1", p.Leases)
		}
		l, err := cli.Acquire(ctx, "w")
		if err != nil || l.ID.Seq != 1 {
			t.Fatalf("late answer: lease %v, %v", l.ID, err)
		}
		l2, err := cli.Acquire(ctx, "w")
		if err != nil || l2.ID.Seq != 2 {
			t.Fatalf("next acquire: lease %v, %v", l2.ID, err)
		}

		// A late answer nobody collects for half its TTL is left to expire, not handed out.
		if err := cli.Leave(ctx, "w"); err != nil {
			t.Fatal(err)
		}
		nw.Partition("w", "coord")
		if _, err := cli.Acquire(ctx, "w"); !errors.Is(err, shardnet.ErrUnavailable) {
			t.Fatalf("partitioned acquire: %v", err)
		}
		nw.Heal("w", "coord")
		synctest.Wait()
		time.Sleep(ttl / 2)
		l3, err := cli.Acquire(ctx, "w")
		if err != nil || l3.ID.Seq != 4 {
			t.Fatalf("acquire after an uncollected answer: lease %v, %v", l3.ID, err)
		}
		p := d.Progress()
		if len(p.Workers) != 1 || p.Workers[0].Revoked != 0 || p.Workers[0].Leases != 2 {
			t.Fatalf("workers %+v", p.Workers)
		}
	})
}

// TestCombinedCallRetriedAfterLostAnswer loses the answers of combined calls, once because the
// dispatcher answers after the client gave up, once in a partition: each retry returns the lease
// the lost call granted, and the dispatcher grants nothing more.
func TestCombinedCallRetriedAfterLostAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := memnet.New(memnet.Config{})
		d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(1000), ShardSize: 100, LeaseTTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		slow := &lateAnswers{Service: d, delay: 3 * time.Second, late: func(call int64) bool { return call == 1 }}
		s := serve(t, nw, "coord", "coord:1", slow)
		defer s.stop()
		cli := newClient(t, nw, "w", "coord:1", time.Second)
		defer cli.Close()
		ctx := context.Background()
		a, err := cli.Acquire(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.ReportAndAcquire(ctx, "w", a.ID, 100); !errors.Is(err, shardnet.ErrUnavailable) {
			t.Fatalf("late answer: %v", err)
		}
		if p := d.Progress(); p.Leases != 2 || p.EpochRecords[0].Done != 100 {
			t.Fatalf("the lost call did not take effect: %+v", p)
		}
		b, err := cli.ReportAndAcquire(ctx, "w", a.ID, 100)
		if err != nil || b.ID.Seq != 2 {
			t.Fatalf("retry: lease %v, %v", b.ID, err)
		}

		nw.Partition("w", "coord")
		if _, err := cli.ReportAndAcquire(ctx, "w", b.ID, 100); !errors.Is(err, shardnet.ErrUnavailable) {
			t.Fatalf("partitioned: %v", err)
		}
		nw.Heal("w", "coord")
		synctest.Wait() // the held request is delivered and answered
		if p := d.Progress(); p.Leases != 3 || p.EpochRecords[0].Done != 200 {
			t.Fatalf("after the partition healed: %+v", p)
		}
		c, err := cli.ReportAndAcquire(ctx, "w", b.ID, 100)
		if err != nil || c.ID.Seq != 3 {
			t.Fatalf("retry after the partition: lease %v, %v", c.ID, err)
		}
		p := d.Progress()
		if p.Leases != 3 || p.EpochRecords[0].Done != 200 || len(p.Workers) != 1 || p.Workers[0].Leases != 1 || p.Workers[0].Revoked != 0 {
			t.Fatalf("progress %+v", p)
		}
		if n := s.srv.Stats().ReportAcquires; n != 4 {
			t.Fatalf("%d combined calls served, want 4", n)
		}
	})
}

func TestCloseAndShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := memnet.New(memnet.Config{})
		d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 10})
		if err != nil {
			t.Fatal(err)
		}
		s := serve(t, nw, "coord", "coord:1", d)
		ctx := context.Background()
		cli := newClient(t, nw, "w", "coord:1", time.Second)
		l, err := cli.Acquire(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		if err := cli.Close(); err != nil {
			t.Fatal(err)
		}
		if err := cli.Close(); err != nil {
			t.Fatal(err)
		}
		_, err = cli.Acquire(ctx, "w")
		_, raErr := cli.ReportAndAcquire(ctx, "w", l.ID, 10)
		errs := []error{err, cli.Report(ctx, "w", l.ID, 1, false), cli.Leave(ctx, "w"), raErr}
		for i, err := range errs {
			if !errors.Is(err, shardnet.ErrClosed) || !errors.Is(err, shard.ErrPermanent) {
				t.Fatalf("call %d on a closed client: %v", i, err)
			}
		}
		if err := s.srv.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.stop(); err != nil { // a second Close, then Serve's result
			t.Fatalf("serve after close: %v", err)
		}

		// A graceful shutdown: Serve returns nil, and later calls are unavailable, not failed.
		s2 := serve(t, nw, "coord", "coord:2", d)
		cli2 := newClient(t, nw, "w", "coord:2", time.Second)
		defer cli2.Close()
		if err := cli2.Report(ctx, "w", l.ID, 1, false); err != nil {
			t.Fatal(err)
		}
		if err := s2.srv.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-s2.done; err != nil {
			t.Fatalf("serve after shutdown: %v", err)
		}
		if err := cli2.Report(ctx, "w", l.ID, 2, false); !errors.Is(err, shardnet.ErrUnavailable) {
			t.Fatalf("report after shutdown: %v", err)
		}
		_ = s2.srv.Close()
	})
}

// TestSetAddr follows a coordinator that comes back at another address.
func TestSetAddr(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := memnet.New(memnet.Config{})
		cfg := shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 10, Incarnation: 1}
		d1, err := shard.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s1 := serve(t, nw, "old", "old:1", d1)
		ctx := context.Background()
		cli := newClient(t, nw, "w", "old:1", time.Second)
		defer cli.Close()
		l, err := cli.Acquire(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		if err := cli.Report(ctx, "w", l.ID, 4, false); err != nil {
			t.Fatal(err)
		}
		snap := d1.Snapshot()
		// The old coordinator becomes unreachable while the worker asks for a shard: the request
		// stays outstanding there.
		nw.Partition("w", "old")
		defer func() { nw.Heal("w", "old"); _ = s1.stop() }()
		if _, err := cli.Acquire(ctx, "w"); !errors.Is(err, shardnet.ErrUnavailable) {
			t.Fatalf("acquire from an unreachable coordinator: %v", err)
		}
		if err := cli.Report(ctx, "w", l.ID, 5, false); !errors.Is(err, shardnet.ErrUnavailable) {
			t.Fatalf("report to an unreachable coordinator: %v", err)
		}

		cfg.Incarnation = 2
		d2, err := shard.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := d2.Restore(snap); err != nil {
			t.Fatal(err)
		}
		s2 := serve(t, nw, "new", "new:1", d2)
		defer s2.stop()
		cli.SetAddr("new:1")
		if cli.Addr() != "new:1" {
			t.Fatalf("addr %q", cli.Addr())
		}
		if err := cli.Report(ctx, "w", l.ID, 5, false); !errors.Is(err, shard.ErrStaleLease) {
			t.Fatalf("report on a lease of the old incarnation: %v", err)
		}
		start := time.Now()
		l2, err := cli.Acquire(ctx, "w") // does not wait for the request outstanding at the old address
		if err != nil || l2.ID.Incarnation != 2 || l2.Shard.Index != l.Shard.Index || l2.Offset != 4 || time.Since(start) != 0 {
			t.Fatalf("after the move: %+v, %v after %v", l2, err, time.Since(start))
		}
	})
}

func TestConfigValidate(t *testing.T) {
	count := func(err error) int {
		j, ok := err.(interface{ Unwrap() []error })
		if !ok {
			return 0
		}
		return len(j.Unwrap())
	}
	err := shardnet.ServerConfig{MaxConcurrent: -1, HandshakeTimeout: -time.Second}.Validate()
	if !errors.Is(err, shardnet.ErrInvalidConfig) || count(err) != 5 {
		t.Fatalf("server config: %v", err)
	}
	if _, err := shardnet.NewServer(shardnet.ServerConfig{}); !errors.Is(err, shardnet.ErrInvalidConfig) {
		t.Fatalf("NewServer: %v", err)
	}
	err = shardnet.ClientConfig{CallTimeout: -1, DialTimeout: -1, Conns: 65}.Validate()
	if !errors.Is(err, shardnet.ErrInvalidConfig) || count(err) != 6 {
		t.Fatalf("client config: %v", err)
	}
	if _, err := shardnet.NewClient(shardnet.ClientConfig{Addr: "x"}); !errors.Is(err, shardnet.ErrInvalidConfig) {
		t.Fatalf("NewClient: %v", err)
	}
	short := []byte("a secret under 32 bytes")
	for _, err := range []error{
		(shardnet.ClientConfig{Addr: "x:1", Secret: short}).Validate(),
		(shardnet.ServerConfig{Service: failing{io.EOF}, Secret: short}).Validate(),
	} {
		if !errors.Is(err, shardnet.ErrInvalidConfig) || !strings.Contains(err.Error(), "Secret is 23 bytes; at least 32") {
			t.Fatalf("a short secret: %v", err)
		}
	}
	if err := (shardnet.ClientConfig{Addr: "x:1", Secret: secret}).Validate(); err != nil {
		t.Fatal(err)
	}
	if err := (shardnet.ServerConfig{Service: failing{io.EOF}, Secret: secret}).Validate(); err != nil {
		t.Fatal(err)
	}
}
