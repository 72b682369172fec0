package rpc

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/wire"
)

func TestWrongSecretRefused(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{Secret: []byte("not the cluster secret")})
	_, err := c.Call(context.Background(), e.addr, mEcho, []byte("must not run"))
	require.ErrorIs(t, err, ErrAuth)
	assert.Contains(t, err.Error(), e.addr)
	assert.NotErrorIs(t, err, ErrUnavailable)
	e.logs.waitLog(t, "client proof does not match the cluster secret")
	assert.Zero(t, len(e.calls), "no handler may run for an unauthenticated client")

	// The right secret still works.
	good := e.client(t, ClientConfig{})
	_, err = good.Call(context.Background(), e.addr, mEcho, nil)
	require.NoError(t, err)
}

func TestImpostorServerRefused(t *testing.T) {
	e := newEnv(t, ServerConfig{Secret: []byte("an impostor's secret")})
	c := e.client(t, ClientConfig{})
	_, err := c.Call(context.Background(), e.addr, mEcho, []byte("secret data"))
	require.ErrorIs(t, err, ErrAuth)
	assert.Contains(t, err.Error(), "server proof")
	assert.Zero(t, len(e.calls))
}

// A client that sends a bad proof and, without waiting, a request: the
// request is never read.
func TestRequestAfterBadProofNeverRead(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	nc := e.rawConn(t)
	hello := wire.Handshake{Type: wire.MsgClientHello, Version: wire.Version}
	_, err := nc.Write(wire.AppendHandshake(nil, hello))
	require.NoError(t, err)
	sh, _, err := wire.ReadHandshake(nc)
	require.NoError(t, err)
	require.Equal(t, wire.MsgServerHello, sh.Type)
	msg := wire.AppendHandshake(nil, wire.Handshake{Type: wire.MsgClientProof}) // all-zero proof
	msg = wire.AppendFrame(msg, wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 1}, []byte("sneak"))
	_, err = nc.Write(msg)
	require.NoError(t, err)
	v, _, err := wire.ReadHandshake(nc)
	require.NoError(t, err)
	assert.Equal(t, wire.VerdictAuthFailed, v.Verdict)
	waitClosed(t, nc)
	e.logs.waitLog(t, "client proof does not match")
	assert.Zero(t, len(e.calls))
}

func TestNotOurProtocol(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	nc := e.rawConn(t)
	_, err := nc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	require.NoError(t, err)
	waitClosed(t, nc)
	e.logs.waitLog(t, "bad handshake magic")
	assert.Zero(t, len(e.calls))
}

func TestHandshakeTimeout(t *testing.T) {
	e := newEnv(t, ServerConfig{HandshakeTimeout: 20 * time.Millisecond})
	nc := e.rawConn(t)
	waitClosed(t, nc) // sends nothing; the server gives up
	e.logs.waitLog(t, "reading client hello")
}

func TestVersionMismatch(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	nc := e.rawConn(t)
	_, err := nc.Write(wire.AppendHandshake(nil, wire.Handshake{Type: wire.MsgClientHello, Version: wire.Version + 1}))
	require.NoError(t, err)
	v, _, err := wire.ReadHandshake(nc)
	require.NoError(t, err)
	assert.Equal(t, wire.MsgVerdict, v.Type)
	assert.Equal(t, wire.VerdictVersion, v.Verdict)
	waitClosed(t, nc)
	e.logs.waitLog(t, "unsupported protocol version")
}

// fakeServer answers every connection on addr with fixed bytes after the
// client hello.
func fakeServer(t *testing.T, e *env, addr string, answer []byte) {
	t.Helper()
	l, err := e.net.Host("fake").Listen(addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				if _, _, err := wire.ReadHandshake(nc); err != nil {
					return
				}
				_, _ = nc.Write(answer)
				_, _ = io.Copy(io.Discard, nc)
			}()
		}
	}()
}

func TestClientHandshakeFailures(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	fakeServer(t, e, "old:1", wire.AppendHandshake(nil, wire.Handshake{Type: wire.MsgVerdict, Verdict: wire.VerdictVersion}))
	fakeServer(t, e, "junk:1", []byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
	fakeServer(t, e, "newer:1", wire.AppendHandshake(nil, wire.Handshake{Type: wire.MsgServerHello, Version: wire.Version + 1}))
	fakeServer(t, e, "mute:1", nil)
	c := e.client(t, ClientConfig{DialTimeout: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	for _, addr := range []string{"old:1", "junk:1", "newer:1"} {
		_, err := c.Call(context.Background(), addr, mEcho, nil)
		assert.ErrorIs(t, err, ErrHandshake, addr)
		assert.Contains(t, err.Error(), addr)
	}
	_, err := c.Call(context.Background(), "mute:1", mEcho, nil)
	assert.ErrorIs(t, err, ErrUnavailable)
}

func TestProofsDiffer(t *testing.T) {
	a := prove(testSecret, serverProofLabel, []byte("x"))
	b := prove(testSecret, clientProofLabel, []byte("x"))
	c := prove([]byte("other"), serverProofLabel, []byte("x"))
	assert.NotEqual(t, a, b)
	assert.NotEqual(t, a, c)
	assert.Equal(t, a, prove(testSecret, serverProofLabel, []byte("x")))
}
