package rpc

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/transport"
	"github.com/elasticps/elasticps/internal/wire"
)

// The tests in this file flood a server over real loopback sockets. Linux
// routes all of 127.0.0.0/8 to the loopback interface, so a test plays
// several source hosts by binding its dialer to 127.0.0.2, 127.0.0.3, ...

// limitEnv is a server on loopback TCP with a response-size handler and a
// blocking handler.
type limitEnv struct {
	srv   *Server
	addr  string
	logs  *logBuf
	block *blocker
	sized atomic.Int64 // runs of the mSize handler
}

// newLimitEnv starts a server; wrap, if set, wraps its listener.
func newLimitEnv(t *testing.T, cfg ServerConfig, wrap func(net.Listener) net.Listener) *limitEnv {
	t.Helper()
	e := &limitEnv{logs: &logBuf{}, block: newBlocker()}
	cfg.Secret = testSecret
	cfg.Logger = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := NewServer(cfg)
	require.NoError(t, err)
	e.srv = srv
	require.NoError(t, srv.Register(mBlock, e.block.handle))
	require.NoError(t, srv.Register(mSize, func(_ context.Context, req []byte, resp *Buffer) error {
		e.sized.Add(1)
		out := resp.Extend(int(binary.LittleEndian.Uint32(req)))
		for i := range out {
			out[i] = byte(i)
		}
		return nil
	}))
	l, err := (&transport.TCP{}).Listen("127.0.0.1:0")
	require.NoError(t, err)
	e.addr = l.Addr().String()
	if wrap != nil {
		l = wrap(l)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return e
}

// dialFrom opens a TCP connection to addr from source IP from.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	nc, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

// fromTransport dials TCP from a source IP.
type fromTransport string

func (f fromTransport) Listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

func (f fromTransport) Dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(string(f))}}
	return d.DialContext(ctx, "tcp", addr)
}

// conns returns how many connections the server holds.
func (e *limitEnv) conns() int {
	e.srv.mu.Lock()
	defer e.srv.mu.Unlock()
	return len(e.srv.conns)
}

// A flood of connections that never authenticate holds at most
// MaxHandshakesPerHost descriptors per source host and MaxHandshakes in
// all: the rest are closed at once and counted, while a client from
// another host still gets in.
func TestHandshakeFloodCapped(t *testing.T) {
	e := newLimitEnv(t, ServerConfig{MaxHandshakes: 8, MaxHandshakesPerHost: 3, HandshakeTimeout: time.Minute}, nil)
	flood := func(from string, n int) []net.Conn {
		conns := make([]net.Conn, n)
		for i := range conns {
			conns[i] = dialFrom(t, from, e.addr)
		}
		return conns
	}

	// One host: three held, the other 37 refused.
	first := flood("127.0.0.2", 40)
	waitFor(t, func() bool { return e.srv.Stats().RefusedConns == 37 }, "37 refusals, have %d", e.srv.Stats().RefusedConns)
	assert.Equal(t, 3, e.conns(), "connections the server holds")
	refused := 0
	for _, nc := range first {
		require.NoError(t, nc.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
		if _, err := nc.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			refused++
		}
	}
	assert.Equal(t, 37, refused, "connections the server closed")

	// A client on another host is served meanwhile.
	c, err := NewClient(ClientConfig{Secret: testSecret, ConnsPerAddr: 1, Transport: fromTransport("127.0.0.1")})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Call(context.Background(), e.addr, mSize, sizeReq(10))
	require.NoError(t, err)

	// Many hosts: eight held in all.
	for _, from := range []string{"127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		flood(from, 3)
	}
	waitFor(t, func() bool { return e.srv.Stats().RefusedConns == 37+4 }, "41 refusals, have %d", e.srv.Stats().RefusedConns)
	assert.Equal(t, 8+1, e.conns(), "eight connections authenticating and the client's")
	assert.Zero(t, e.srv.Stats().FailedHandshakes)
}

// A flood of refused connections writes a bounded number of log lines,
// and the ones that pass say how many were left out.
func TestRefusalsLoggedAtLimitedRate(t *testing.T) {
	for _, how := range []string{"over the limit", "garbage"} {
		t.Run(how, func(t *testing.T) {
			e := newLimitEnv(t, ServerConfig{MaxHandshakes: 4, MaxHandshakesPerHost: 1}, nil)
			start := time.Now()
			const n = 200
			for range n {
				nc := dialFrom(t, "127.0.0.2", e.addr)
				if how == "garbage" {
					_, _ = nc.Write([]byte(strings.Repeat("GET / HTTP/1.1\r\n", 4)))
					waitClosed(t, nc) // one at a time: none is over the limit
				}
			}
			counter := func() uint64 { return e.srv.Stats().RefusedConns }
			want := uint64(n - 1)
			if how == "garbage" {
				counter = func() uint64 { return e.srv.Stats().FailedHandshakes }
				want = n
			}
			waitFor(t, func() bool { return counter() == want }, "%d refusals, have %d", want, counter())
			lines := strings.Count(e.logs.String(), "rpc: connection refused")
			bound := peerLogBurst + int(time.Since(start)/peerLogInterval) + 1
			assert.LessOrEqual(t, lines, bound, "log lines for %d refusals in %v", want, time.Since(start))
			assert.Positive(t, lines)
		})
	}
}

func TestRateLog(t *testing.T) {
	logs := &logBuf{}
	now := time.Unix(1000, 0)
	r := newRateLog(slog.New(slog.NewTextHandler(logs, nil)), 3, time.Second, func() time.Time { return now })
	for i := range 10 {
		r.Warn("refused", "i", i)
	}
	assert.Equal(t, 3, strings.Count(logs.String(), "refused"), "the burst")
	now = now.Add(1500 * time.Millisecond)
	r.Warn("refused", "i", 10)
	r.Warn("refused", "i", 11)
	assert.Equal(t, 4, strings.Count(logs.String(), "refused"), "one more a second")
	assert.Contains(t, logs.String(), "i=10 suppressed=7")
	now = now.Add(time.Hour)
	for i := range 5 {
		r.Warn("later", "i", i)
	}
	assert.Equal(t, 3, strings.Count(logs.String(), "later"), "the burst again, no more")
	assert.Contains(t, logs.String(), "i=0 suppressed=1")
}

// smallBuffers makes the kernel buffer little of what the server writes,
// so that a client that does not read stops the server's writes soon.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(16 << 10)
	}
	return nc, err
}

// tcpAuthConn dials addr with a small receive buffer and authenticates.
func tcpAuthConn(t *testing.T, addr string) *handConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	require.NoError(t, nc.(*net.TCPConn).SetReadBuffer(16<<10))
	cfg := newCommon(testSecret, ProtectIntegrity, nil, 0, false, 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sess, err := clientHandshake(ctx, nc, &cfg)
	require.NoError(t, err)
	return &handConn{Conn: nc, sess: sess}
}

// A client that sends requests and does not read the answers makes the
// server hold at most MaxConnInFlight bytes of answers (plus what the
// kernel buffers): the server stops reading the connection, runs no more
// handlers, and goes on once the client reads.
func TestInFlightResponsesCapped(t *testing.T) {
	const limit, respSize, n = 1 << 20, 8000, 400
	// Few handlers at a time, so that the answers of handlers still
	// running when the server stops reading add at most four.
	e := newLimitEnv(t, ServerConfig{MaxConnInFlight: limit, MaxConcurrent: 4}, func(l net.Listener) net.Listener { return smallBuffers{l} })
	hc := tcpAuthConn(t, e.addr)
	var reqs []byte
	for i := range n {
		reqs = append(reqs, hc.sealed(wire.Header{Kind: wire.KindRequest, Method: mSize, ID: uint64(i + 1)}, sizeReq(respSize))...)
	}
	wrote := make(chan error, 1)
	go func() { _, err := hc.Write(reqs); wrote <- err }()
	waitFor(t, func() bool { return e.srv.Stats().ThrottledReads > 0 }, "the server to stop reading")
	// What the kernel holds in both directions is below 256 KiB here.
	ran := e.sized.Load()
	assert.Less(t, ran, int64((limit+256<<10)/respSize+4), "handlers run for a client that reads nothing")
	require.NoError(t, hc.Conn.(*net.TCPConn).SetReadBuffer(4<<20)) // read fast now
	rd := hc.reader()
	for i := range n {
		f, err := rd.ReadFrame()
		require.NoError(t, err, "response %d", i)
		require.Equal(t, wire.KindResponse, f.Kind)
		require.Len(t, f.Payload, respSize)
	}
	require.NoError(t, recv(t, wrote))
	assert.Equal(t, int64(n), e.sized.Load())
}

// Requests that handlers hold count too: with handlers that wait, the
// server reads only MaxConnInFlight bytes of requests, then the rest once
// handlers return.
func TestInFlightRequestsCapped(t *testing.T) {
	const limit, reqSize, n = 1 << 20, 100 << 10, 30
	e := newLimitEnv(t, ServerConfig{MaxConnInFlight: limit}, nil)
	c, err := NewClient(ClientConfig{Secret: testSecret, ConnsPerAddr: 1})
	require.NoError(t, err)
	defer c.Close()
	errs := make(chan error, n)
	for i := range n {
		go func() {
			req := make([]byte, reqSize)
			req[0] = byte(i)
			_, err := c.Call(context.Background(), e.addr, mBlock, req)
			errs <- err
		}()
	}
	// 11 requests of 100 KiB make 1 MiB: the server reads them, then stops.
	waitFor(t, func() bool { return e.srv.Stats().ThrottledReads > 0 && len(e.block.started) == limit/reqSize+1 }, "the server to stop reading")
	assert.Equal(t, limit/reqSize+1, len(e.block.started), "requests read and handed to handlers")
	close(e.block.release)
	for range n {
		assert.NoError(t, recv(t, errs))
	}
	assert.Equal(t, n, len(e.block.started))
}
