package rpc

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/wire"
)

// otherSecret is a valid secret that is not the cluster's.
var otherSecret = []byte("not the cluster secret, 32 bytes")

func TestWrongSecretRefused(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{Secret: otherSecret})
	_, err := c.Call(context.Background(), e.addr, mEcho, []byte("must not run"))
	require.ErrorIs(t, err, ErrAuth)
	assert.Contains(t, err.Error(), e.addr)
	assert.Contains(t, err.Error(), "server refused the cluster secret")
	assert.NotErrorIs(t, err, ErrUnavailable)
	e.logs.waitLog(t, "client proof does not match the cluster secret")
	assert.Zero(t, len(e.calls), "no handler may run for an unauthenticated client")
	assert.Equal(t, Stats{AuthFailures: 1}, e.srv.Stats())
	assert.Equal(t, Stats{AuthFailures: 1}, c.Stats())

	// The right secret still works.
	good := e.client(t, ClientConfig{})
	_, err = good.Call(context.Background(), e.addr, mEcho, nil)
	require.NoError(t, err)
}

// A server with another secret refuses the client before it proves
// anything itself.
func TestServerWithOtherSecretRefused(t *testing.T) {
	e := newEnv(t, ServerConfig{Secret: otherSecret})
	c := e.client(t, ClientConfig{})
	_, err := c.Call(context.Background(), e.addr, mEcho, []byte("secret data"))
	require.ErrorIs(t, err, ErrAuth)
	assert.Zero(t, len(e.calls))
}

// impostor serves addr on e's network with a server that follows the
// protocol but does not know the secret: it accepts any client proof and
// answers with proof(clientHello, serverHello, clientProof). It reports
// on got whatever the client sends after the handshake.
func impostor(t *testing.T, e *env, addr string, proof func(ch, sh, cp []byte) [wire.MACSize]byte) (got chan []byte) {
	t.Helper()
	l, err := e.net.Host("impostor").Listen(addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	got = make(chan []byte, 16)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				_, ch, err := wire.ReadHandshake(nc)
				if err != nil {
					return
				}
				sh := wire.AppendHandshake(nil, wire.Handshake{Type: wire.MsgServerHello, Version: wire.Version, Nonce: [wire.NonceSize]byte{1}})
				if _, err := nc.Write(sh); err != nil {
					return
				}
				_, cp, err := wire.ReadHandshake(nc)
				if err != nil {
					return
				}
				if _, err := nc.Write(wire.AppendHandshake(nil, wire.Handshake{Type: wire.MsgServerProof, Proof: proof(ch, sh, cp)})); err != nil {
					return
				}
				_ = nc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				rest, _ := io.ReadAll(nc)
				got <- rest
			}()
		}
	}()
	return got
}

// A server that cannot prove it knows the secret is refused, and hears
// nothing after the handshake.
func TestImpostorServerRefused(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	got := impostor(t, e, "impostor:1", func(_, _, _ []byte) [wire.MACSize]byte { return [wire.MACSize]byte{42} })
	c := e.client(t, ClientConfig{})
	_, err := c.Call(context.Background(), "impostor:1", mEcho, []byte("secret data"))
	require.ErrorIs(t, err, ErrAuth)
	assert.Contains(t, err.Error(), "server proof does not match")
	assert.Empty(t, recv(t, got), "the client sent nothing after a failed server proof")
	assert.Equal(t, Stats{AuthFailures: 1}, c.Stats())
}

// Proofs are compared in full: a proof right in all but its last byte is
// refused, by the server and by the client.
func TestProofsCheckedInFull(t *testing.T) {
	for _, at := range []int{0, 8, wire.MACSize - 1} {
		// Client side: a correct client proof with one byte changed.
		e := newEnv(t, ServerConfig{})
		nc := e.rawConn(t)
		ch, err := writeMsg(nc, wire.Handshake{Type: wire.MsgClientHello, Version: wire.Version, Nonce: [wire.NonceSize]byte{9}})
		require.NoError(t, err)
		_, sh, err := wire.ReadHandshake(nc)
		require.NoError(t, err)
		p := clientProof(testSecret, ch, sh)
		p[at] ^= 1
		_, err = writeMsg(nc, wire.Handshake{Type: wire.MsgClientProof, Proof: p})
		require.NoError(t, err)
		v, _, err := wire.ReadHandshake(nc)
		require.NoError(t, err)
		assert.Equal(t, wire.MsgVerdict, v.Type, "client proof wrong at byte %d", at)
		assert.Equal(t, wire.VerdictAuthFailed, v.Verdict)
		waitClosed(t, nc)

		// Server side: a correct server proof with one byte changed.
		addr := fmt.Sprintf("impostor:%d", 100+at)
		got := impostor(t, e, addr, func(ch, sh, cp []byte) [wire.MACSize]byte {
			p := serverProof(testSecret, ch, sh, cp)
			p[at] ^= 1
			return p
		})
		c := e.client(t, ClientConfig{})
		_, err = c.Call(context.Background(), addr, mEcho, nil)
		assert.ErrorIs(t, err, ErrAuth, "server proof wrong at byte %d", at)
		assert.Empty(t, recv(t, got))

		// The unaltered proofs pass, so the test exercises the comparison.
		ok := impostor(t, e, addr+"0", func(ch, sh, cp []byte) [wire.MACSize]byte { return serverProof(testSecret, ch, sh, cp) })
		_, err = c.Call(context.Background(), addr+"0", mEcho, nil)
		assert.NotErrorIs(t, err, ErrAuth)
		assert.NotEmpty(t, recv(t, ok), "the client sent its request")
	}
}

// Before the client has proved it knows the secret, the server sends
// nothing that depends on the secret: a hello of fixed fields and a fresh
// nonce, and after a wrong proof a bare refusal. So anyone who can reach
// the port gets nothing to test guesses of the secret against.
func TestServerRevealsNothingBeforeClientProves(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	nc := e.rawConn(t)
	_, err := writeMsg(nc, wire.Handshake{Type: wire.MsgClientHello, Version: wire.Version})
	require.NoError(t, err)
	sh, raw, err := wire.ReadHandshake(nc)
	require.NoError(t, err)
	assert.Equal(t, wire.MsgServerHello, sh.Type)
	assert.Len(t, raw, wire.HandshakeSize(wire.MsgServerHello))
	want := wire.AppendHandshake(nil, wire.Handshake{Type: wire.MsgServerHello, Version: wire.Version, MaxFrame: uint32(wire.DefaultMaxFrameSize), Nonce: sh.Nonce})
	assert.Equal(t, want, raw, "the hello holds only fixed fields and the nonce")
	// Nothing more comes until the client proves.
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	n, err := nc.Read(make([]byte, 1))
	assert.Zero(t, n)
	assert.Error(t, err)
	require.NoError(t, nc.SetReadDeadline(time.Time{}))
	_, err = writeMsg(nc, wire.Handshake{Type: wire.MsgClientProof})
	require.NoError(t, err)
	rest, err := io.ReadAll(nc)
	require.NoError(t, err)
	assert.Equal(t, wire.AppendHandshake(nil, wire.Handshake{Type: wire.MsgVerdict, Verdict: wire.VerdictAuthFailed}), rest)
}

func TestSecretTooShortRefused(t *testing.T) {
	for _, secret := range [][]byte{nil, []byte("short"), testSecret[:MinSecretSize-1]} {
		err := ServerConfig{Secret: secret}.Validate()
		assert.ErrorIs(t, err, ErrInvalidConfig)
		assert.Contains(t, err.Error(), "Secret")
		_, err = NewServer(ServerConfig{Secret: secret})
		assert.ErrorIs(t, err, ErrInvalidConfig)
		_, err = NewClient(ClientConfig{Secret: secret})
		assert.ErrorIs(t, err, ErrInvalidConfig)
		assert.Error(t, ValidateSecret(secret))
	}
	assert.NoError(t, ValidateSecret(testSecret))
	assert.Contains(t, ValidateSecret([]byte("short")).Error(), "at least 32")
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
	ch, sh, cp := []byte("client hello"), []byte("server hello"), []byte("client proof")
	a := serverProof(testSecret, ch, sh, cp)
	b := clientProof(testSecret, ch, sh)
	c := serverProof(otherSecret, ch, sh, cp)
	d := serverProof(testSecret, []byte("client hello with another nonce"), sh, cp)
	assert.NotEqual(t, a, b)
	assert.NotEqual(t, a, c)
	assert.NotEqual(t, a, d, "the server's proof depends on the client's hello")
	assert.NotEqual(t, b, clientProof(testSecret, ch, []byte("server hello with another nonce")), "the client's proof depends on the server's hello")
	assert.Equal(t, a, serverProof(testSecret, ch, sh, cp))
}

func TestNegotiation(t *testing.T) {
	all := []Protection{ProtectIntegrity, ProtectEncrypt, ProtectNone}
	want := map[[2]Protection]Protection{
		{ProtectIntegrity, ProtectIntegrity}: ProtectIntegrity,
		{ProtectIntegrity, ProtectEncrypt}:   ProtectEncrypt,
		{ProtectIntegrity, ProtectNone}:      ProtectIntegrity,
		{ProtectEncrypt, ProtectIntegrity}:   ProtectEncrypt,
		{ProtectEncrypt, ProtectEncrypt}:     ProtectEncrypt,
		{ProtectEncrypt, ProtectNone}:        ProtectEncrypt,
		{ProtectNone, ProtectIntegrity}:      ProtectIntegrity,
		{ProtectNone, ProtectEncrypt}:        ProtectEncrypt,
		{ProtectNone, ProtectNone}:           ProtectNone,
	}
	for _, cp := range all {
		for _, sp := range all {
			e := newEnv(t, ServerConfig{Protection: sp})
			c := e.client(t, ClientConfig{Protection: cp, ConnsPerAddr: 1})
			resp, err := c.Call(context.Background(), e.addr, mEcho, []byte("hi"))
			require.NoError(t, err)
			assert.Equal(t, "hi", string(resp))
			p := c.peer(e.addr)
			p.slots[0].mu.Lock()
			sess := p.slots[0].cc.sess
			p.slots[0].mu.Unlock()
			w := want[[2]Protection{cp, sp}]
			assert.Equal(t, w, sess.protection, "client %v, server %v", cp, sp)
			assert.Equal(t, w == ProtectNone, sess.send == nil)
			if sess.send != nil {
				assert.Equal(t, w == ProtectEncrypt, sess.send.Encrypts())
			}
		}
	}
}
