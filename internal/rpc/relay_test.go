package rpc

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/transport"
	"github.com/elasticps/elasticps/internal/wire"
)

// tcpEnv is a server on a loopback TCP port whose handlers record every
// request they run.
type tcpEnv struct {
	srv  *Server
	addr string
	logs *logBuf

	mu  sync.Mutex
	ran []string // payloads of the requests handlers ran, in order
}

func newTCPEnv(t *testing.T, cfg ServerConfig) *tcpEnv {
	t.Helper()
	e := &tcpEnv{logs: &logBuf{}}
	cfg.Secret = testSecret
	cfg.Logger = slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := NewServer(cfg)
	require.NoError(t, err)
	e.srv = srv
	require.NoError(t, srv.Register(mEcho, func(_ context.Context, req []byte, resp *Buffer) error {
		e.mu.Lock()
		e.ran = append(e.ran, string(req))
		e.mu.Unlock()
		_, _ = resp.Write(req)
		return nil
	}))
	l, err := (&transport.TCP{}).Listen("127.0.0.1:0")
	require.NoError(t, err)
	e.addr = l.Addr().String()
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

// handled returns the payloads of the requests handlers ran so far.
func (e *tcpEnv) handled() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.ran...)
}

func (e *tcpEnv) client(t *testing.T, cfg ClientConfig) *Client {
	t.Helper()
	if cfg.Secret == nil {
		cfg.Secret = testSecret
	}
	cfg.ConnsPerAddr = 1
	c, err := NewClient(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// relay sits between clients and a server on loopback TCP, as an attacker
// on the path would: it forwards the handshake untouched, recording it,
// then reads the frames of each direction whole and lets the test's hooks
// forward, drop, change, repeat, reorder or add to them. It knows the frame
// layout but no key.
type relay struct {
	t      *testing.T
	addr   string
	target string
	tagged bool // frames carry a tag

	// toServer is called with each frame a client sends, numbered from 0
	// per connection, and returns what to send on instead. Nil forwards.
	toServer func(conn, n int, frame []byte) [][]byte
	// toClient is the same for the server's frames.
	toClient func(conn, n int, frame []byte) [][]byte

	mu       sync.Mutex
	conns    int
	hs       [][][]byte    // per connection: the handshake messages in order
	captured [][]byte      // per connection: every byte the client sent
	answered [][]uint64    // per connection: ids of the server's frames
	closed   chan struct{} // receives when a server closes a relayed connection
}

func newRelay(t *testing.T, target string, tagged bool) *relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &relay{t: t, addr: l.Addr().String(), target: target, tagged: tagged, closed: make(chan struct{}, 16)}
	var wg sync.WaitGroup
	var open sync.Map
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			open.Store(c, s)
			r.mu.Lock()
			id := r.conns
			r.conns++
			r.hs = append(r.hs, nil)
			r.captured = append(r.captured, nil)
			r.answered = append(r.answered, nil)
			r.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.serve(id, c, s)
				open.Delete(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		open.Range(func(c, s any) bool {
			_ = c.(net.Conn).Close()
			_ = s.(net.Conn).Close()
			return true
		})
		wg.Wait()
	})
	return r
}

func (r *relay) record(id int, msg []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hs[id] = append(r.hs[id], msg)
}

// handshake returns the handshake messages of connection id.
func (r *relay) handshake(id int) [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hs[id]
}

// sent returns every byte the client of connection id sent.
func (r *relay) sent(id int) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.captured[id]
}

// answers returns the ids of the frames the server sent on connection id.
func (r *relay) answers(id int) []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.answered[id]...)
}

// pass forwards one handshake message from src to dst and records it.
func (r *relay) pass(id int, src, dst net.Conn) (wire.Handshake, bool) {
	m, raw, err := wire.ReadHandshake(src)
	if err != nil {
		return m, false
	}
	r.record(id, raw)
	_, err = dst.Write(raw)
	return m, err == nil
}

func (r *relay) serve(id int, c, s net.Conn) {
	defer c.Close()
	defer s.Close()
	if _, ok := r.pass(id, c, s); !ok { // client hello
		return
	}
	if _, ok := r.pass(id, s, c); !ok { // server hello
		return
	}
	if _, ok := r.pass(id, c, s); !ok { // client proof
		return
	}
	if m, ok := r.pass(id, s, c); !ok || m.Type != wire.MsgServerProof {
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		r.frames(id, c, s, r.toServer, func(f []byte) {
			r.mu.Lock()
			r.captured[id] = append(r.captured[id], f...)
			r.mu.Unlock()
		})
		_ = s.Close()
	}()
	go func() {
		defer wg.Done()
		r.frames(id, s, c, r.toClient, func(f []byte) {
			r.mu.Lock()
			r.answered[id] = append(r.answered[id], binary.LittleEndian.Uint64(f[8:16]))
			r.mu.Unlock()
		})
		r.closed <- struct{}{}
		_ = c.Close()
	}()
	wg.Wait()
}

// frames reads whole frames from src, hands each to seen and hook, and
// writes what hook returns to dst.
func (r *relay) frames(id int, src, dst net.Conn, hook func(conn, n int, frame []byte) [][]byte, seen func([]byte)) {
	tag := 0
	if r.tagged {
		tag = wire.TagSize
	}
	for n := 0; ; n++ {
		hdr := make([]byte, wire.HeaderSize)
		if _, err := io.ReadFull(src, hdr); err != nil {
			return
		}
		size := int(binary.LittleEndian.Uint32(hdr))
		f := make([]byte, wire.HeaderSize+size+tag)
		copy(f, hdr)
		if _, err := io.ReadFull(src, f[wire.HeaderSize:]); err != nil {
			return
		}
		seen(f)
		out := [][]byte{f}
		if hook != nil {
			out = hook(id, n, f)
		}
		for _, o := range out {
			if _, err := dst.Write(o); err != nil {
				return
			}
		}
	}
}

// waitServerClosed waits until the server closed a relayed connection.
func (r *relay) waitServerClosed(t *testing.T) {
	t.Helper()
	select {
	case <-r.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not close the connection")
	}
}

// callResult is a Call's outcome.
type callResult struct {
	resp []byte
	err  error
}

// goCall starts a call and returns where its result arrives.
func goCall(c *Client, addr string, req string) <-chan callResult {
	ch := make(chan callResult, 1)
	go func() {
		resp, err := c.Call(context.Background(), addr, mEcho, []byte(req))
		ch <- callResult{resp, err}
	}()
	return ch
}
