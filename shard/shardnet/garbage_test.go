package shardnet

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardwire"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// rpcServer runs an rpc.Server with the given handlers as host at addr until the test ends.
func rpcServer(t *testing.T, nw *memnet.Network, host, addr string, handlers map[uint16]rpc.Handler) {
	t.Helper()
	s, err := rpc.NewServer(rpc.ServerConfig{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	for m, h := range handlers {
		if err := s.Register(m, h); err != nil {
			t.Fatal(err)
		}
	}
	l, err := nw.Host(host).Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(l) }()
	t.Cleanup(func() { _ = s.Close(); <-done })
}

// TestGarbageHurtsNoOne sends bytes that are not the protocol, and authenticated requests that
// do not decode, while a well-behaved client works on: the garbage is refused, counted and
// logged; the client notices nothing.
func TestGarbageHurtsNoOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := memnet.New(memnet.Config{})
		d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(1000), ShardSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := NewServer(ServerConfig{Service: d, Secret: testSecret})
		if err != nil {
			t.Fatal(err)
		}
		l, err := nw.Host("coord").Listen("coord:1")
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()
		defer func() {
			_ = srv.Close()
			if err := <-served; err != nil {
				t.Errorf("serve: %v", err)
			}
		}()
		ctx := context.Background()
		good, err := NewClient(ClientConfig{Addr: "coord:1", Secret: testSecret, Transport: nw.Host("good")})
		if err != nil {
			t.Fatal(err)
		}
		defer good.Close()
		lease, err := good.Acquire(ctx, "good")
		if err != nil {
			t.Fatal(err)
		}

		// Bytes that are not the protocol at all: the server drops that connection at once (well
		// before its handshake timeout).
		rng := rand.New(rand.NewPCG(1, 2))
		junk := make([]byte, 4096)
		for i := range junk {
			junk[i] = byte(rng.Uint32())
		}
		raw, err := nw.Host("junk").Dial(ctx, "coord:1")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = raw.Write(junk)
		_ = raw.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := io.ReadAll(raw); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("the server kept a connection sending garbage open")
		}
		_ = raw.Close()

		// Authenticated requests that do not decode: each is refused with a bad-request error.
		rc, err := rpc.NewClient(rpc.ClientConfig{Secret: testSecret, Transport: nw.Host("sloppy")})
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		acquire := shardwire.AppendAcquireRequest(nil, shardwire.AcquireRequest{Worker: "x"})
		report := shardwire.AppendReportRequest(nil, shardwire.ReportRequest{Worker: "x", Lease: lease.ID, Offset: 3})
		long := shardwire.AppendLeaveRequest(nil, shardwire.LeaveRequest{Worker: strings.Repeat("x", shard.MaxWorkerName+1)})
		combined := shardwire.AppendReportAcquireRequest(nil, shardwire.ReportAcquireRequest{Worker: "x", Lease: lease.ID, Offset: 3})
		bad := []struct {
			method uint16
			req    []byte
		}{
			{methodAcquire, nil},
			{methodAcquire, junk[:64]},
			{methodAcquire, append(acquire, 0)},              // trailing byte
			{methodReport, report[:len(report)-1]},           // truncated
			{methodReport, append([]byte{9}, report[1:]...)}, // unknown version
			{methodLeave, long},                              // worker name too long
			{methodLeave, append(append([]byte(nil), long[:3]...), 'x')},
			{methodReportAcquire, combined[:len(combined)-1]}, // truncated
			{methodReportAcquire, append(combined, 1)},        // trailing byte
		}
		for i, b := range bad {
			_, err := rc.Call(ctx, "coord:1", b.method, b.req)
			var re *rpc.RemoteError
			if !errors.As(err, &re) || re.Code != codeBadRequest {
				t.Fatalf("bad request %d: %v", i, err)
			}
		}
		if st := srv.Stats(); st.Malformed != uint64(len(bad)) || st.Acquires != 1 || st.Reports != 0 || st.Leaves != 0 || st.ReportAcquires != 0 {
			t.Fatalf("stats %+v", st)
		}

		// The good client carries on over its connection.
		if err := good.Report(ctx, "good", lease.ID, lease.Shard.Records, true); err != nil {
			t.Fatal(err)
		}
		if _, err := good.Acquire(ctx, "good"); err != nil {
			t.Fatal(err)
		}
		if p := d.Progress(); p.EpochRecords[0].Done != lease.Shard.Records || p.Leases != 2 {
			t.Fatalf("progress %+v", p)
		}
	})
}

// TestClientRefusesNonDispatchers points clients at servers that are not dispatchers of this
// protocol: the calls fail with ErrProtocol, which a Reader does not retry; a server-side
// panic is a remote failure that it does retry. A server that does not know the combined call
// answers it with errors.ErrUnsupported, which is not permanent either: the Reader makes the two
// calls instead.
func TestClientRefusesNonDispatchers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := memnet.New(memnet.Config{})
		status := shardwire.AppendStatus(nil, shardwire.Status{})
		rpcServer(t, nw, "other", "other:1", nil) // knows none of the methods
		rpcServer(t, nw, "skewed", "skewed:1", map[uint16]rpc.Handler{
			methodAcquire: func(_ context.Context, _ []byte, resp *rpc.Buffer) error {
				_, _ = resp.Write([]byte{2, 0, 0}) // a future version
				return nil
			},
			methodReport: func(_ context.Context, _ []byte, resp *rpc.Buffer) error {
				_, _ = resp.Write(append(append([]byte(nil), status...), 0)) // trailing byte
				return nil
			},
			methodLeave: func(_ context.Context, _ []byte, resp *rpc.Buffer) error {
				return &rpc.RemoteError{Code: codeBadRequest, Message: "cannot decode"}
			},
		})
		rpcServer(t, nw, "buggy", "buggy:1", map[uint16]rpc.Handler{
			methodAcquire: func(context.Context, []byte, *rpc.Buffer) error { panic("bug") },
			methodReport:  func(context.Context, []byte, *rpc.Buffer) error { panic("bug") },
			methodLeave:   func(context.Context, []byte, *rpc.Buffer) error { panic("bug") },
		})
		ctx := context.Background()
		for _, tc := range []struct {
			addr      string
			want      error
			permanent bool
		}{{"other:1", ErrProtocol, true}, {"skewed:1", ErrProtocol, true}, {"buggy:1", shardwire.ErrRemote, false}} {
			cli, err := NewClient(ClientConfig{Addr: tc.addr, Secret: testSecret, Transport: nw.Host("w")})
			if err != nil {
				t.Fatal(err)
			}
			_, err = cli.Acquire(ctx, "w")
			errs := []error{err, cli.Report(ctx, "w", shard.LeaseID{Seq: 1}, 1, false), cli.Leave(ctx, "w")}
			for i, err := range errs {
				if !errors.Is(err, tc.want) || errors.Is(err, shard.ErrPermanent) != tc.permanent {
					t.Errorf("%s call %d: %v", tc.addr, i, err)
				}
			}
			if _, err := cli.ReportAndAcquire(ctx, "w", shard.LeaseID{Seq: 1}, 1); !errors.Is(err, errors.ErrUnsupported) || errors.Is(err, shard.ErrPermanent) {
				t.Errorf("%s combined call: %v", tc.addr, err)
			}
			_ = cli.Close()
		}
	})
}
