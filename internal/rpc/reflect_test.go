package rpc

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/wire"
)

// The two directions of a connection have their own keys: a frame a side
// sent, fed back to that same side under the counter it was sealed with,
// fails authentication. Were both keys equal, the server's response number
// n, relayed back to it as the client's frame number n, would pass.
func TestFrameReflectedToItsSenderRefused(t *testing.T) {
	for _, prot := range protectedModes {
		t.Run(prot.String(), func(t *testing.T) {
			cfg := newCommon(testSecret, prot, nil, 0, false, 0, 0)
			ch := wire.Handshake{Type: wire.MsgClientHello, Version: wire.Version, Flags: helloFlags(&cfg, false)}
			sh := wire.Handshake{Type: wire.MsgServerHello, Version: wire.Version, Flags: helloFlags(&cfg, false)}
			_, err := rand.Read(ch.Nonce[:])
			require.NoError(t, err)
			_, err = rand.Read(sh.Nonce[:])
			require.NoError(t, err)
			sessions := func() (srv, cli session) {
				srv, err := newSession(&cfg, ch, sh, false)
				require.NoError(t, err)
				cli, err = newSession(&cfg, ch, sh, true)
				require.NoError(t, err)
				return srv, cli
			}
			read := func(p *wire.Protector, frame []byte) error {
				_, err := wire.NewReader(bytes.NewReader(frame), wire.ReaderOptions{Protector: p}).ReadFrame()
				return err
			}
			h := wire.Header{Kind: wire.KindResponse, ID: 1}

			// The control: each direction's frames pass at the other end.
			srv, cli := sessions()
			require.NoError(t, read(cli.recv, wire.AppendSealedFrame(nil, srv.send, h, []byte("answer"))))
			require.NoError(t, read(srv.recv, wire.AppendSealedFrame(nil, cli.send, wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 1}, []byte("ask"))))

			// Fresh sessions, so that every counter is 0: a frame comes
			// back to its sender under the very counter it was sealed with.
			srv, cli = sessions()
			assert.ErrorIs(t, read(srv.recv, wire.AppendSealedFrame(nil, srv.send, h, []byte("answer"))), wire.ErrIntegrity, "server's own frame")
			assert.ErrorIs(t, read(cli.recv, wire.AppendSealedFrame(nil, cli.send, wire.Header{Kind: wire.KindRequest, Method: mEcho, ID: 1}, []byte("ask"))), wire.ErrIntegrity, "client's own frame")
		})
	}
}

// Over a real connection: a relay answers the client's first request with
// that request itself, which carries the counter the client expects of the
// server's first frame. The client refuses it as forged, not merely as a
// frame of the wrong kind.
func TestRelayReflectedFrameRefused(t *testing.T) {
	for _, prot := range protectedModes {
		t.Run(prot.String(), func(t *testing.T) {
			e := newTCPEnv(t, ServerConfig{Protection: prot})
			r := newRelay(t, e.addr, true)
			r.toClient = func(conn, n int, f []byte) [][]byte {
				if n != 0 {
					return [][]byte{f}
				}
				return [][]byte{r.sent(conn)} // the client's one frame so far
			}
			c := e.client(t, ClientConfig{})
			_, err := c.Call(context.Background(), r.addr, mEcho, []byte("reflect me"))
			assert.ErrorIs(t, err, ErrConnClosed)
			assert.ErrorIs(t, err, wire.ErrIntegrity)
			assert.Equal(t, uint64(1), c.Stats().ForgedFrames)
		})
	}
}
