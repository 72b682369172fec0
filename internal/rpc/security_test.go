package rpc

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/wire"
)

// The tests in this file attack the protocol over real loopback sockets,
// from a relay on the path (see relay) or from a client of their own.

var protectedModes = []Protection{ProtectIntegrity, ProtectEncrypt}

// requestFrame makes a request frame the way the relay might forge one:
// a correct header and payload followed by tag.
func requestFrame(id uint64, payload string, tag []byte) []byte {
	f := wire.AppendFrame(nil, wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: id}, []byte(payload))
	return append(f, tag...)
}

// refusedForgery checks that the server refused a forged frame on relayed
// connection conn: it closed the connection, counted and logged the
// frame, ran no handler beyond want and answered nothing beyond answered.
func refusedForgery(t *testing.T, e *tcpEnv, r *relay, conn int, want []string, answered []uint64) {
	t.Helper()
	r.waitServerClosed(t)
	e.logs.waitLog(t, "frame failed authentication")
	assert.Equal(t, want, e.handled(), "handlers run")
	assert.Equal(t, answered, r.answers(conn), "frames the server sent")
	assert.Equal(t, uint64(1), e.srv.Stats().ForgedFrames)
}

// A relay that forwards a genuine handshake and then adds a request of its
// own gets no answer: the server closes the connection.
func TestRelayInjectedRequestRefused(t *testing.T) {
	for _, prot := range protectedModes {
		for _, how := range []string{"zero tag", "tag of the previous frame", "frame of another connection"} {
			t.Run(prot.String()+"/"+how, func(t *testing.T) {
				e := newTCPEnv(t, ServerConfig{Protection: prot})
				r := newRelay(t, e.addr, true)
				c := e.client(t, ClientConfig{})
				var first []byte
				r.toServer = func(conn, n int, f []byte) [][]byte {
					if conn == 0 && n == 0 {
						first = bytes.Clone(f)
					}
					if conn != 1 || n != 1 {
						return [][]byte{f}
					}
					var injected []byte
					switch how {
					case "zero tag":
						injected = requestFrame(99, "injected", make([]byte, wire.TagSize))
					case "tag of the previous frame":
						injected = requestFrame(99, "injected", first[len(first)-wire.TagSize:])
					default:
						injected = first // sealed with connection 0's keys
					}
					return [][]byte{injected, f}
				}
				// Connection 0: one genuine call, then the client moves on.
				resp, err := c.Call(context.Background(), r.addr, mEcho, []byte("genuine"))
				require.NoError(t, err)
				assert.Equal(t, "genuine", string(resp))
				require.NoError(t, c.Close())
				r.waitServerClosed(t) // the client closed connection 0
				// Connection 1: a genuine call, then the injection.
				c = e.client(t, ClientConfig{})
				_, err = c.Call(context.Background(), r.addr, mEcho, []byte("genuine"))
				require.NoError(t, err)
				_, err = c.Call(context.Background(), r.addr, mEcho, []byte("second"))
				assert.ErrorIs(t, err, ErrConnClosed)
				refusedForgery(t, e, r, 1, []string{"genuine", "genuine"}, []uint64{1})
			})
		}
	}
}

// A genuine request changed anywhere by the relay is refused and never
// run.
func TestRelayAlteredRequestRefused(t *testing.T) {
	for _, prot := range protectedModes {
		for _, alt := range []struct {
			name string
			at   func(f []byte) int
		}{
			{"payload", func(f []byte) int { return wire.HeaderSize }},
			{"method", func(f []byte) int { return 6 }},
			{"id", func(f []byte) int { return 8 }},
			{"last tag byte", func(f []byte) int { return len(f) - 1 }},
			{"first tag byte", func(f []byte) int { return len(f) - wire.TagSize }},
		} {
			t.Run(prot.String()+"/"+alt.name, func(t *testing.T) {
				e := newTCPEnv(t, ServerConfig{Protection: prot})
				r := newRelay(t, e.addr, true)
				r.toServer = func(_, _ int, f []byte) [][]byte {
					f[alt.at(f)] ^= 1
					return [][]byte{f}
				}
				c := e.client(t, ClientConfig{})
				_, err := c.Call(context.Background(), r.addr, mEcho, []byte("genuine request"))
				assert.ErrorIs(t, err, ErrConnClosed)
				refusedForgery(t, e, r, 0, nil, nil)
			})
		}
	}
}

// The relay repeats a genuine request: it runs once.
func TestRelayReplayedRequestRefused(t *testing.T) {
	for _, prot := range protectedModes {
		t.Run(prot.String(), func(t *testing.T) {
			e := newTCPEnv(t, ServerConfig{Protection: prot})
			r := newRelay(t, e.addr, true)
			r.toServer = func(_, _ int, f []byte) [][]byte { return [][]byte{f, f} }
			c := e.client(t, ClientConfig{})
			res := goCall(c, r.addr, "pay once")
			r.waitServerClosed(t)
			e.logs.waitLog(t, "frame failed authentication")
			<-res // answered or not: the connection was closed right after
			assert.Equal(t, []string{"pay once"}, e.handled(), "the replayed request ran again")
			assert.LessOrEqual(t, len(r.answers(0)), 1)
			assert.Equal(t, uint64(1), e.srv.Stats().ForgedFrames)
		})
	}
}

// The relay swaps two genuine requests, or drops the first: neither
// reaches a handler.
func TestRelayReorderedOrDroppedRequestsRefused(t *testing.T) {
	for _, prot := range protectedModes {
		for _, how := range []string{"reordered", "dropped"} {
			t.Run(prot.String()+"/"+how, func(t *testing.T) {
				e := newTCPEnv(t, ServerConfig{Protection: prot})
				r := newRelay(t, e.addr, true)
				held := make(chan []byte, 1)
				r.toServer = func(_, n int, f []byte) [][]byte {
					if n == 0 {
						held <- f
						return nil
					}
					first := <-held
					if how == "dropped" {
						return [][]byte{f}
					}
					return [][]byte{f, first}
				}
				c := e.client(t, ClientConfig{})
				a := goCall(c, r.addr, "A")
				waitFor(t, func() bool { return len(held) == 1 }, "the relay to hold the first request")
				b := goCall(c, r.addr, "B")
				assert.ErrorIs(t, recv(t, a).err, ErrConnClosed)
				assert.ErrorIs(t, recv(t, b).err, ErrConnClosed)
				refusedForgery(t, e, r, 0, nil, nil)
			})
		}
	}
}

// A response changed by the relay fails the call on the client.
func TestRelayAlteredResponseRefused(t *testing.T) {
	for _, prot := range protectedModes {
		t.Run(prot.String(), func(t *testing.T) {
			e := newTCPEnv(t, ServerConfig{Protection: prot})
			r := newRelay(t, e.addr, true)
			r.toClient = func(_, _ int, f []byte) [][]byte {
				f[wire.HeaderSize+2] ^= 0x40
				return [][]byte{f}
			}
			c := e.client(t, ClientConfig{})
			_, err := c.Call(context.Background(), r.addr, mEcho, []byte("balance: 100"))
			assert.ErrorIs(t, err, ErrConnClosed)
			assert.ErrorIs(t, err, wire.ErrIntegrity)
			assert.Equal(t, uint64(1), c.Stats().ForgedFrames)
		})
	}
}

// The control experiment: with protection off at both ends the same relay
// does get its injected request run and answered, so the tests above
// measure the protection, not a relay that cannot inject.
func TestRelayInjectsWhenUnprotected(t *testing.T) {
	e := newTCPEnv(t, ServerConfig{Protection: ProtectNone})
	r := newRelay(t, e.addr, false)
	r.toServer = func(_, n int, f []byte) [][]byte {
		if n == 1 {
			return [][]byte{requestFrame(99, "injected", nil), f}
		}
		return [][]byte{f}
	}
	c := e.client(t, ClientConfig{Protection: ProtectNone})
	for _, req := range []string{"genuine", "second"} {
		_, err := c.Call(context.Background(), r.addr, mEcho, []byte(req))
		require.NoError(t, err)
	}
	// The injected request runs beside the genuine ones, so its answer may come after theirs.
	waitFor(t, func() bool { return slices.Contains(r.answers(0), 99) }, "the answer to the injected request")
	assert.ElementsMatch(t, []string{"genuine", "injected", "second"}, e.handled())
}

// A client's recorded handshake, replayed to the server on a new
// connection, is refused: the server's fresh nonce makes the recorded
// proof worthless.
func TestReplayedClientHandshakeRefused(t *testing.T) {
	e := newTCPEnv(t, ServerConfig{})
	r := newRelay(t, e.addr, true)
	c := e.client(t, ClientConfig{})
	_, err := c.Call(context.Background(), r.addr, mEcho, []byte("genuine"))
	require.NoError(t, err)
	hs := r.handshake(0) // client hello, server hello, client proof, server proof
	require.Len(t, hs, 4)

	nc, err := net.Dial("tcp", e.addr)
	require.NoError(t, err)
	defer nc.Close()
	_, err = nc.Write(hs[0])
	require.NoError(t, err)
	sh, _, err := wire.ReadHandshake(nc)
	require.NoError(t, err)
	require.Equal(t, wire.MsgServerHello, sh.Type)
	// The recorded proof, then the recorded request.
	_, err = nc.Write(append(bytes.Clone(hs[2]), r.sent(0)...))
	require.NoError(t, err)
	v, _, err := wire.ReadHandshake(nc)
	require.NoError(t, err)
	assert.Equal(t, wire.MsgVerdict, v.Type)
	assert.Equal(t, wire.VerdictAuthFailed, v.Verdict)
	waitClosed(t, nc)
	e.logs.waitLog(t, "client proof does not match")
	assert.Equal(t, []string{"genuine"}, e.handled())
	assert.Equal(t, uint64(1), e.srv.Stats().AuthFailures)
}

// A server's recorded handshake, replayed to a client by an impostor
// listening in its place, is refused: the server's proof covers the
// client's fresh nonce.
func TestReplayedServerHandshakeRefused(t *testing.T) {
	e := newTCPEnv(t, ServerConfig{})
	r := newRelay(t, e.addr, true)
	c := e.client(t, ClientConfig{})
	_, err := c.Call(context.Background(), r.addr, mEcho, []byte("genuine"))
	require.NoError(t, err)
	hs := r.handshake(0)
	require.Len(t, hs, 4)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	heard := make(chan []byte, 1)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		if _, _, err := wire.ReadHandshake(nc); err != nil {
			return
		}
		_, _ = nc.Write(hs[1])
		if _, _, err := wire.ReadHandshake(nc); err != nil {
			return
		}
		_, _ = nc.Write(hs[3])
		_ = nc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		rest, _ := io.ReadAll(nc)
		heard <- rest
	}()
	victim := e.client(t, ClientConfig{})
	_, err = victim.Call(context.Background(), l.Addr().String(), mEcho, []byte("for the real server only"))
	require.ErrorIs(t, err, ErrAuth)
	assert.Contains(t, err.Error(), "server proof does not match")
	assert.Empty(t, recv(t, heard), "the client sent nothing to the impostor")
}

// Encrypted connections round-trip every size, with and without
// compression, whichever end asks for encryption; the bytes on the wire
// do not hold the plaintext (which they do under integrity alone).
func TestEncryptedRoundTripTCP(t *testing.T) {
	marker := []byte("a plaintext marker the relay must not see")
	random := make([]byte, 4<<20)
	_, _ = rand.Read(random)
	compressible := bytes.Repeat(marker, (1<<20)/len(marker))
	for _, tc := range []struct {
		name           string
		server, client Protection
		compress       bool
		hidden         bool
	}{
		{"server asks", ProtectEncrypt, ProtectIntegrity, false, true},
		{"client asks", ProtectIntegrity, ProtectEncrypt, false, true},
		{"both ask, s2", ProtectEncrypt, ProtectEncrypt, true, true},
		{"integrity only", ProtectIntegrity, ProtectIntegrity, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTCPEnv(t, ServerConfig{Protection: tc.server, Compression: tc.compress})
			r := newRelay(t, e.addr, true)
			c := e.client(t, ClientConfig{Protection: tc.client, Compression: tc.compress})
			for _, req := range [][]byte{nil, marker, bytes.Repeat([]byte{1}, coalesceMax+1), random, compressible} {
				resp, err := c.Call(context.Background(), r.addr, mEcho, req)
				require.NoError(t, err)
				require.True(t, bytes.Equal(req, resp), "%d bytes", len(req))
				c.Release(resp)
			}
			assert.Equal(t, !tc.hidden, bytes.Contains(r.sent(0), marker))
			assert.Equal(t, Stats{}, e.srv.Stats())
		})
	}
}

// A header announcing more than the limit closes the connection before
// the server allocates anything of that size (measured in bytes
// allocated, not bytes read).
func TestOversizedFrameAllocatesNothingTCP(t *testing.T) {
	e := newTCPEnv(t, ServerConfig{MaxFrameSize: 1 << 20})
	nc, err := net.Dial("tcp", e.addr)
	require.NoError(t, err)
	defer nc.Close()
	cfg := newCommon(testSecret, ProtectIntegrity, nil, 0, false, 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = clientHandshake(ctx, nc, &cfg)
	require.NoError(t, err)
	n := allocatedBy(func() {
		_, err = nc.Write(wire.AppendHeader(nil, wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 1, Size: 1 << 30}))
		require.NoError(t, err)
		waitClosed(t, nc)
		e.logs.waitLog(t, "frame too large")
	})
	assert.Less(t, n, uint64(32<<20), "bytes allocated while refusing a 1 GiB header")
	assert.Empty(t, e.handled())
}

// allocatedBy returns the bytes the process allocated while fn ran.
func allocatedBy(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
