package shardnet_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

// served is a Server running Serve on a memnet listener.
type served struct {
	srv  *shardnet.Server
	done chan error // Serve's result
}

// serve serves svc as host at addr.
func serve(t *testing.T, nw *memnet.Network, host, addr string, svc shard.Service) *served {
	t.Helper()
	srv, err := shardnet.NewServer(shardnet.ServerConfig{Service: svc, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	l, err := nw.Host(host).Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &served{srv: srv, done: make(chan error, 1)}
	go func() { s.done <- srv.Serve(l) }()
	return s
}

// stop closes the server and waits for Serve to return.
func (s *served) stop() error {
	_ = s.srv.Close()
	return <-s.done
}

func newClient(t *testing.T, nw *memnet.Network, host, addr string, callTimeout time.Duration) *shardnet.Client {
	t.Helper()
	c, err := shardnet.NewClient(shardnet.ClientConfig{Addr: addr, Secret: secret, Transport: nw.Host(host), CallTimeout: callTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// notifier wraps a Service and wakes a waiter after every call it forwards, so that a test
// waits for progress itself rather than for a while.
type notifier struct {
	shard.Service
	ch chan struct{}
}

func newNotifier() *notifier { return &notifier{ch: make(chan struct{}, 1)} }

// wrap returns a Service forwarding to svc that pokes n.
func (n *notifier) wrap(svc shard.Service) shard.Service { return &notifier{Service: svc, ch: n.ch} }

func (n *notifier) poke() {
	select {
	case n.ch <- struct{}{}:
	default:
	}
}

func (n *notifier) Acquire(ctx context.Context, w string) (shard.Lease, error) {
	defer n.poke()
	return n.Service.Acquire(ctx, w)
}

func (n *notifier) Report(ctx context.Context, w string, id shard.LeaseID, off int64, done bool) error {
	defer n.poke()
	return n.Service.Report(ctx, w, id, off, done)
}

func (n *notifier) Leave(ctx context.Context, w string) error {
	defer n.poke()
	return n.Service.Leave(ctx, w)
}

func (n *notifier) ReportAndAcquire(ctx context.Context, w string, id shard.LeaseID, off int64) (shard.Lease, error) {
	defer n.poke()
	return shard.ReportAndAcquire(ctx, n.Service, w, id, off)
}

// lateAnswers wraps a Service and holds back the answers of the combined calls late picks (by
// their number, from 1) for delay after they took effect, so that a client with a shorter
// CallTimeout gives up on them: answers lost on the way back.
type lateAnswers struct {
	shard.Service
	delay       time.Duration
	late        func(call int64) bool
	calls, held atomic.Int64
}

func (l *lateAnswers) ReportAndAcquire(ctx context.Context, w string, id shard.LeaseID, off int64) (shard.Lease, error) {
	lease, err := shard.ReportAndAcquire(ctx, l.Service, w, id, off)
	if l.late(l.calls.Add(1)) {
		l.held.Add(1)
		time.Sleep(l.delay)
	}
	return lease, err
}

// waitFor waits until cond holds, re-checking after every call through the notifier. It fails
// the test after a minute (of the test's clock).
func (n *notifier) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(time.Minute)
	for !cond() {
		select {
		case <-n.ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// labelled is an in-memory data set whose record i has label i.
func labelled(n int64) shard.Indexed {
	return shard.IndexedFunc(n, func(i int64, rec *shard.Record) error {
		rec.Label = float32(i)
		rec.IDs = append(rec.IDs, uint64(i))
		rec.EndField()
		return nil
	})
}

// counters sums reader statistics across workers.
type counters struct {
	mu sync.Mutex
	shard.ReaderStats
}

func (c *counters) add(s shard.ReaderStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Leases += s.Leases
	c.LostLeases += s.LostLeases
	c.Batches += s.Batches
	c.Records += s.Records
	c.Reported += s.Reported
	c.Retries += s.Retries
	c.Waits += s.Waits
	c.Combined += s.Combined
}
