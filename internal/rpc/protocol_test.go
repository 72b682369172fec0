package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/internal/wire"
)

func TestBadFramesCloseOnlyThatConnection(t *testing.T) {
	e := newEnv(t, ServerConfig{MaxFrameSize: 1 << 20})
	good := e.client(t, ClientConfig{})
	inflight := make(chan error, 1)
	var inflightResp []byte
	go func() {
		var err error
		inflightResp, err = good.Call(context.Background(), e.addr, mBlock, []byte("in flight"))
		inflight <- err
	}()
	<-e.block.started

	var comp wire.Pool
	compressed, ok := wire.Compress(&comp, bytes.Repeat([]byte("a"), 4096))
	require.True(t, ok)
	garbage := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 8)
	cases := []struct {
		name   string
		bytes  func(h *handConn) []byte
		close  bool // close our end after writing
		reason string
	}{
		{"garbage", raw(garbage), false, "unknown kind"},
		{"oversized", raw(wire.AppendHeader(nil, wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 1, Size: 1<<20 + 1})), false, "frame too large"},
		{"truncated", func(h *handConn) []byte {
			return h.sealed(wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 1}, make([]byte, 100))[:60]
		}, true, "truncated frame"},
		{"response from client", func(h *handConn) []byte { return h.sealed(wire.Header{Kind: wire.KindResponse, ID: 1}, nil) }, false, "unexpected response frame"},
		{"compression not negotiated", func(h *handConn) []byte {
			return h.sealed(wire.Header{Kind: wire.KindRequest, Flags: wire.FlagCompressed, Method: mEcho, ID: 1}, compressed)
		}, false, "without compression"},
		{"bad flags", raw(append(binary.LittleEndian.AppendUint32(nil, 0), 1, 0x80, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0)), false, "unknown flags"},
		{"forged tag", raw(append(wire.AppendFrame(nil, wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 1}, []byte("unsealed")), make([]byte, wire.TagSize)...)), false, "frame failed authentication"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nc := e.authConn(t)
			_, err := nc.Write(tc.bytes(nc))
			require.NoError(t, err)
			if tc.close {
				require.NoError(t, nc.Close())
			} else {
				waitClosed(t, nc)
			}
			e.logs.waitLog(t, tc.reason)
			// Everyone else is unaffected.
			resp, err := good.Call(context.Background(), e.addr, mEcho, []byte(tc.name))
			require.NoError(t, err)
			assert.Equal(t, tc.name, string(resp))
		})
	}
	close(e.block.release)
	require.NoError(t, <-inflight)
	assert.Equal(t, "in flight", string(inflightResp))
	assert.Equal(t, len(cases), e.handlerRuns(mEcho), "no bad frame reached a handler")
}

// raw is a test case's bytes that do not depend on the connection.
func raw(b []byte) func(*handConn) []byte { return func(*handConn) []byte { return b } }

// A well-formed request written by hand gets its answer: the frame layout
// documented in package wire is what the server speaks.
func TestHandWrittenRequest(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	nc := e.authConn(t)
	_, err := nc.Write(nc.sealed(wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 77}, []byte("by hand")))
	require.NoError(t, err)
	f, err := nc.reader().ReadFrame()
	require.NoError(t, err)
	assert.Equal(t, wire.KindResponse, f.Kind)
	assert.Equal(t, uint64(77), f.ID)
	assert.Equal(t, "by hand", string(f.Payload))
}

// FuzzServerInput writes arbitrary bytes to the server, before and after
// authentication; the server must not crash, must not run a handler for an
// unauthenticated peer, and must keep serving other clients.
func FuzzServerInput(f *testing.F) {
	f.Add([]byte{}, false)
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), false)
	f.Add(wire.AppendHandshake(nil, wire.Handshake{Type: wire.MsgClientHello, Version: wire.Version}), false)
	f.Add(wire.AppendFrame(nil, wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 1}, []byte("x")), false)
	f.Add(wire.AppendFrame(nil, wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 1}, []byte("x")), true)
	f.Add(wire.AppendFrame(nil, wire.Header{Kind: wire.KindRequest, Method: 999, ID: 1}, nil), true)
	f.Add(wire.AppendHeader(nil, wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 1, Size: 1 << 30}), true)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 0, 1, 0}, true)
	f.Fuzz(func(t *testing.T, in []byte, authenticate bool) {
		e := newEnv(t, ServerConfig{MaxFrameSize: 1 << 16})
		good := e.client(t, ClientConfig{})
		if authenticate {
			nc := e.authConn(t)
			_, _ = nc.Write(in)
			_ = nc.Close()
		} else {
			nc := e.rawConn(t)
			_, _ = nc.Write(in)
			_ = nc.Close()
			if len(e.calls) != 0 {
				t.Fatalf("a handler ran for an unauthenticated peer")
			}
		}
		resp, err := good.Call(context.Background(), e.addr, mEcho, []byte("alive"))
		if err != nil || string(resp) != "alive" {
			t.Fatalf("server stopped serving: %v", err)
		}
	})
}

// FuzzClientInput has an authenticated server answer with arbitrary bytes;
// the client must neither crash nor hang, and must classify the outcome.
func FuzzClientInput(f *testing.F) {
	f.Add(wire.AppendFrame(nil, wire.Header{Kind: wire.KindResponse, ID: 1}, []byte("ok")))
	f.Add(wire.AppendFrame(nil, wire.Header{Kind: wire.KindError, ID: 1}, wire.AppendError(nil, 100, "no", []byte{1})))
	f.Add(wire.AppendFrame(nil, wire.Header{Kind: wire.KindError, ID: 1}, []byte{1, 2, 3}))
	f.Add(wire.AppendFrame(nil, wire.Header{Kind: wire.KindGoAway}, nil))
	f.Add(wire.AppendFrame(nil, wire.Header{Kind: wire.KindRequest, Method: 1, ID: 1}, nil))
	f.Add(wire.AppendHeader(nil, wire.Header{Kind: wire.KindResponse, ID: 1, Size: 1000}))
	f.Add([]byte("garbage garbage garbage"))
	f.Fuzz(func(t *testing.T, in []byte) {
		n := memnet.New(memnet.Config{})
		l, err := n.Host("fake").Listen("fake:1")
		require.NoError(t, err)
		defer l.Close()
		cfg := newCommon(testSecret, ProtectIntegrity, nil, 1<<16, false, 0, 0)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				nc, err := l.Accept()
				if err != nil {
					return
				}
				if _, err := serverHandshake(nc, &cfg, 5*time.Second); err == nil {
					_, _ = nc.Write(in)
				}
				_ = nc.Close()
			}
		}()
		c, err := NewClient(ClientConfig{Secret: testSecret, Transport: n.Host("cli"), MaxFrameSize: 1 << 16})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := c.Call(ctx, "fake:1", mEcho, []byte("x"))
		var re *RemoteError
		switch {
		case err == nil:
			c.Release(resp)
		case errors.As(err, &re), errors.Is(err, ErrConnClosed), errors.Is(err, ErrUnavailable):
		default:
			t.Fatalf("unexpected error class: %v", err)
		}
		require.NoError(t, c.Close())
		_ = l.Close()
		wg.Wait()
	})
}
