package rpc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/transport"
	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/internal/wire"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

const (
	mEcho uint16 = iota + 1
	mBlock
	mFail
	mPanic
	mSize
)

// logBuf collects log output for assertions; safe for concurrent use.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitLog waits until the log contains s.
func (l *logBuf) waitLog(t *testing.T, s string) {
	t.Helper()
	waitFor(t, func() bool { return strings.Contains(l.String(), s) }, "log line %q; log so far:\n%s", s, l)
}

// waitFor polls cond until it holds, failing after 10 s.
func waitFor(t *testing.T, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for "+msg, args...)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

// recv receives from ch, failing after 10 s.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting on a channel")
		panic("unreachable")
	}
}

// checkGoroutines records the goroutine count and returns a function that
// waits for it to come back down.
func checkGoroutines(t *testing.T) func() {
	t.Helper()
	base := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Fatalf("goroutines leaked: %d > %d\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
			}
			runtime.Gosched()
			time.Sleep(time.Millisecond)
		}
	}
}

// blocker is a handler that signals when it starts and waits for release
// or its context.
type blocker struct {
	started chan []byte
	release chan struct{}
}

func newBlocker() *blocker {
	return &blocker{started: make(chan []byte, 100), release: make(chan struct{})}
}

func (b *blocker) handle(ctx context.Context, req []byte, resp *Buffer) error {
	b.started <- append([]byte(nil), req...)
	select {
	case <-b.release:
		_, _ = resp.Write(req)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// env is a server on memnet host "srv" at address "srv:7000" with a set of
// test handlers.
type env struct {
	net      *memnet.Network
	srv      *Server
	addr     string
	logs     *logBuf
	block    *blocker
	calls    chan uint16 // every handler invocation, by method
	serveErr chan error
}

func echo(_ context.Context, req []byte, resp *Buffer) error {
	_, _ = resp.Write(req)
	return nil
}

func newEnv(t *testing.T, cfg ServerConfig) *env {
	t.Helper()
	e := &env{net: memnet.New(memnet.Config{}), addr: "srv:7000", logs: &logBuf{}, block: newBlocker(), calls: make(chan uint16, 100000)}
	if cfg.Secret == nil {
		cfg.Secret = testSecret
	}
	cfg.Logger = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := NewServer(cfg)
	require.NoError(t, err)
	e.srv = srv
	track := func(m uint16, h Handler) Handler {
		return func(ctx context.Context, req []byte, resp *Buffer) error {
			e.calls <- m
			return h(ctx, req, resp)
		}
	}
	require.NoError(t, srv.Register(mEcho, track(mEcho, echo)))
	require.NoError(t, srv.Register(mBlock, track(mBlock, e.block.handle)))
	require.NoError(t, srv.Register(mFail, track(mFail, func(_ context.Context, req []byte, _ *Buffer) error {
		return &RemoteError{Code: 1001, Message: "wrong owner", Data: req}
	})))
	require.NoError(t, srv.Register(mPanic, track(mPanic, func(context.Context, []byte, *Buffer) error {
		var m map[string]int
		m["boom"]++
		return nil
	})))
	require.NoError(t, srv.Register(mSize, track(mSize, func(_ context.Context, req []byte, resp *Buffer) error {
		n := int(req[0]) | int(req[1])<<8 | int(req[2])<<16 | int(req[3])<<24
		out := resp.Extend(n)
		for i := range out {
			out[i] = byte(i * 7)
		}
		return nil
	})))
	e.serve(t)
	t.Cleanup(func() { _ = srv.Close() })
	return e
}

// serve starts serving on e.addr.
func (e *env) serve(t *testing.T) {
	t.Helper()
	l, err := e.net.Host("srv").Listen(e.addr)
	require.NoError(t, err)
	e.serveErr = make(chan error, 1)
	go func() { e.serveErr <- e.srv.Serve(l) }()
}

func (e *env) client(t *testing.T, cfg ClientConfig) *Client {
	t.Helper()
	if cfg.Secret == nil {
		cfg.Secret = testSecret
	}
	if cfg.Transport == nil {
		cfg.Transport = e.net.Host("cli")
	}
	c, err := NewClient(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (e *env) handlerRuns(m uint16) int {
	n := 0
	for {
		select {
		case got := <-e.calls:
			if got == m {
				n++
			}
		default:
			return n
		}
	}
}

func sizeReq(n int) []byte {
	return []byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24)}
}

var _ transport.Transport = (*memnet.Host)(nil)

// nopListener is a listener that is already closed.
type nopListener struct{}

func (nopListener) Accept() (net.Conn, error) { return nil, net.ErrClosed }
func (nopListener) Close() error              { return nil }
func (nopListener) Addr() net.Addr            { return memnet.Addr("nop") }

// rawConn dials the env's server from host "raw" without authenticating.
func (e *env) rawConn(t *testing.T) net.Conn {
	t.Helper()
	nc, err := e.net.Host("raw").Dial(context.Background(), e.addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

// handConn is an authenticated connection on which a test writes frames by
// hand, sealed with the session's keys.
type handConn struct {
	net.Conn
	sess session
}

// sealed returns a frame protected as this connection's next frame.
func (h *handConn) sealed(hd wire.Header, payload []byte) []byte {
	if h.sess.send == nil {
		return wire.AppendFrame(nil, hd, payload)
	}
	return wire.AppendSealedFrame(nil, h.sess.send, hd, payload)
}

// reader returns a frame reader checking the server's frames.
func (h *handConn) reader() *wire.Reader {
	return wire.NewReader(h.Conn, wire.ReaderOptions{Protector: h.sess.recv})
}

// authConn dials the env's server and completes the handshake, leaving a
// connection on which the test writes frames by hand.
func (e *env) authConn(t *testing.T) *handConn {
	t.Helper()
	nc := e.rawConn(t)
	cfg := newCommon(testSecret, ProtectIntegrity, nil, 0, false, 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sess, err := clientHandshake(ctx, nc, &cfg)
	require.NoError(t, err)
	return &handConn{Conn: nc, sess: sess}
}

// waitClosed reads from nc until the peer closes it, failing after 10 s.
func waitClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := io.Copy(io.Discard, nc)
	if errors.Is(err, syscall.ECONNRESET) {
		return // TCP resets a connection closed with unread bytes
	}
	require.NoError(t, err, "the server should have closed the connection")
}
