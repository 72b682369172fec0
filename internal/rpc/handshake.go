package rpc

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/elasticps/elasticps/internal/wire"
)

// Labels keep the two proofs and the two direction keys distinct, so a
// value made for one role or direction is useless in the other.
const (
	clientProofLabel = "elasticps rpc v2 client proof"
	serverProofLabel = "elasticps rpc v2 server proof"
	clientKeyLabel   = "elasticps rpc v2 client to server key"
	serverKeyLabel   = "elasticps rpc v2 server to client key"
)

// session is what a handshake agreed on.
type session struct {
	compress   bool       // both hellos offered s2
	peerMax    int        // the largest payload the peer accepts
	tls        bool       // both ends run TLS, which protects the frames
	protection Protection // what the frames carry otherwise
	// send and recv protect the frames this side sends and receives; nil
	// when protection is ProtectNone.
	send, recv *wire.Protector
}

// prove returns HMAC-SHA256(secret, label || parts...).
func prove(secret []byte, label string, parts ...[]byte) [wire.MACSize]byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	for _, p := range parts {
		m.Write(p)
	}
	var out [wire.MACSize]byte
	m.Sum(out[:0])
	return out
}

// clientProof is the client's proof: it covers both hellos, so both
// nonces.
func clientProof(secret, clientHello, serverHello []byte) [wire.MACSize]byte {
	return prove(secret, clientProofLabel, clientHello, serverHello)
}

// serverProof is the server's proof: it covers the whole exchange, the
// client's hello (its fresh nonce) and proof included, so it is worthless
// to anyone but the client that sent them.
func serverProof(secret, clientHello, serverHello, clientProofMsg []byte) [wire.MACSize]byte {
	return prove(secret, serverProofLabel, clientHello, serverHello, clientProofMsg)
}

// proofsEqual compares two proofs in full and in constant time.
func proofsEqual(a, b [wire.MACSize]byte) bool { return hmac.Equal(a[:], b[:]) }

// negotiate returns the protection of a connection from the two hellos'
// flags: encrypted if either asks, unprotected only if both accept it,
// integrity otherwise.
func negotiate(client, server wire.HelloFlags) Protection {
	switch {
	case (client|server)&wire.HelloEncrypt != 0:
		return ProtectEncrypt
	case client&server&wire.HelloUnprotected != 0:
		return ProtectNone
	default:
		return ProtectIntegrity
	}
}

// helloFlags are the flags this side puts in its hello; onTLS says that
// its connection runs TLS.
func helloFlags(cfg *common, onTLS bool) wire.HelloFlags {
	var f wire.HelloFlags
	if cfg.compression {
		f |= wire.HelloCompress
	}
	if onTLS {
		return f | wire.HelloTLS
	}
	switch cfg.protection {
	case ProtectEncrypt:
		f |= wire.HelloEncrypt
	case ProtectNone:
		f |= wire.HelloUnprotected
	}
	return f
}

// sessionKeys derives the two direction keys of a connection:
// HKDF-SHA256 with the secret as input key material, the client's nonce
// followed by the server's as salt, and a label naming the direction and
// the protection as info.
func sessionKeys(secret []byte, nc, ns [wire.NonceSize]byte, p Protection) (c2s, s2c []byte, err error) {
	salt := make([]byte, 0, 2*wire.NonceSize)
	salt = append(append(salt, nc[:]...), ns[:]...)
	c2s, err = hkdf.Key(sha256.New, secret, salt, clientKeyLabel+" "+p.String(), wire.KeySize)
	if err != nil {
		return nil, nil, err
	}
	s2c, err = hkdf.Key(sha256.New, secret, salt, serverKeyLabel+" "+p.String(), wire.KeySize)
	return c2s, s2c, err
}

// newSession assembles the session both hellos describe. isClient says
// which side builds it: the client sends with the client-to-server key.
func newSession(cfg *common, ch, sh wire.Handshake, isClient bool) (session, error) {
	peer := sh
	if !isClient {
		peer = ch
	}
	s := session{
		compress:   cfg.compression && peer.Flags&wire.HelloCompress != 0,
		peerMax:    peerLimit(peer.MaxFrame),
		protection: negotiate(ch.Flags, sh.Flags),
	}
	if ch.Flags&sh.Flags&wire.HelloTLS != 0 {
		// TLS authenticates, orders and encrypts every frame already.
		s.tls, s.protection = true, ProtectNone
		return s, nil
	}
	if s.protection == ProtectNone {
		return s, nil
	}
	c2s, s2c, err := sessionKeys(cfg.secret, ch.Nonce, sh.Nonce, s.protection)
	if err != nil {
		return session{}, err
	}
	sendKey, recvKey := s2c, c2s
	if isClient {
		sendKey, recvKey = c2s, s2c
	}
	encrypt := s.protection == ProtectEncrypt
	if s.send, err = wire.NewProtector(sendKey, encrypt); err != nil {
		return session{}, err
	}
	if s.recv, err = wire.NewProtector(recvKey, encrypt); err != nil {
		return session{}, err
	}
	return s, nil
}

func peerLimit(announced uint32) int {
	return wire.EffectiveMax(int(min(announced, uint32(wire.MaxFrameSizeLimit))))
}

func writeMsg(nc net.Conn, m wire.Handshake) ([]byte, error) {
	b := wire.AppendHandshake(nil, m)
	if _, err := nc.Write(b); err != nil {
		return nil, err
	}
	return b, nil
}

// refusal is a server-side handshake failure: why the connection was
// refused, for the log.
type refusal struct {
	reason string
	err    error
}

func (r *refusal) Error() string {
	if r.err == nil {
		return r.reason
	}
	return r.reason + ": " + r.err.Error()
}

func (r *refusal) Unwrap() error { return r.err }

// serverHandshake authenticates a new connection (see the package
// documentation). It reads only handshake messages: no request is read
// before it returns successfully, and nothing it sends before the client
// has proved it knows the secret depends on the secret. Deadlines on nc are
// cleared on success.
//
//  1. client -> ClientHello{version, flags, maxFrame, nonceC}
//  2. server -> ServerHello{version, flags, maxFrame, nonceS}
//  3. client -> ClientProof{HMAC(secret, clientLabel || ClientHello || ServerHello)}
//  4. server -> ServerProof{HMAC(secret, serverLabel || ClientHello || ServerHello || ClientProof)}
//     or Verdict{AuthFailed | Version}
func serverHandshake(nc net.Conn, cfg *common, timeout time.Duration) (session, error) {
	if err := nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		return session{}, &refusal{"set deadline", err}
	}
	onTLS, err := handshakeTLS(context.Background(), nc)
	if err != nil {
		if errors.Is(err, errUnverifiedPeer) {
			// TLS let it in, so it can read why it is refused.
			_, _ = writeMsg(nc, wire.Handshake{Type: wire.MsgVerdict, Verdict: wire.VerdictAuthFailed})
		}
		return session{}, &refusal{"TLS handshake", err}
	}
	hello, rawHello, err := wire.ReadHandshake(nc)
	if err != nil {
		return session{}, &refusal{"reading client hello", err}
	}
	if hello.Type != wire.MsgClientHello {
		return session{}, &refusal{fmt.Sprintf("expected client hello, got message type %d", hello.Type), nil}
	}
	if hello.Version != wire.Version {
		_, _ = writeMsg(nc, wire.Handshake{Type: wire.MsgVerdict, Verdict: wire.VerdictVersion})
		return session{}, &refusal{fmt.Sprintf("unsupported protocol version %d", hello.Version), nil}
	}
	if err := tlsAgree(onTLS, hello.Flags, "client"); err != nil {
		_, _ = writeMsg(nc, wire.Handshake{Type: wire.MsgVerdict, Verdict: wire.VerdictTLS})
		return session{}, &refusal{"client hello", err}
	}
	sh := wire.Handshake{Type: wire.MsgServerHello, Version: wire.Version, Flags: helloFlags(cfg, onTLS), MaxFrame: uint32(cfg.maxFrame)}
	if _, err := rand.Read(sh.Nonce[:]); err != nil {
		return session{}, &refusal{"reading random nonce", err}
	}
	rawServer, err := writeMsg(nc, sh)
	if err != nil {
		return session{}, &refusal{"writing server hello", err}
	}
	proof, rawProof, err := wire.ReadHandshake(nc)
	if err != nil {
		return session{}, &refusal{"reading client proof", err}
	}
	if proof.Type != wire.MsgClientProof {
		return session{}, &refusal{fmt.Sprintf("expected client proof, got message type %d", proof.Type), nil}
	}
	if !proofsEqual(clientProof(cfg.secret, rawHello, rawServer), proof.Proof) {
		_, _ = writeMsg(nc, wire.Handshake{Type: wire.MsgVerdict, Verdict: wire.VerdictAuthFailed})
		return session{}, &refusal{"client proof does not match the cluster secret", ErrAuth}
	}
	sess, err := newSession(cfg, hello, sh, false)
	if err != nil {
		return session{}, &refusal{"deriving session keys", err}
	}
	accept := wire.Handshake{Type: wire.MsgServerProof, Proof: serverProof(cfg.secret, rawHello, rawServer, rawProof)}
	if _, err := writeMsg(nc, accept); err != nil {
		return session{}, &refusal{"writing server proof", err}
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return session{}, &refusal{"clear deadline", err}
	}
	return sess, nil
}

// clientHandshake is the client side of serverHandshake. ctx bounds it.
// Errors wrap ErrAuth, ErrHandshake or ErrUnavailable (I/O failures).
func clientHandshake(ctx context.Context, nc net.Conn, cfg *common) (session, error) {
	dl, _ := ctx.Deadline()
	if err := nc.SetDeadline(dl); err != nil {
		return session{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	onTLS, err := handshakeTLS(ctx, nc)
	if err == nil {
		var s session
		s, err = clientExchange(nc, cfg, onTLS)
		if err == nil {
			return finishClient(ctx, nc, stop, s)
		}
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrHandshake) {
		return session{}, fmt.Errorf("%w: handshake: %w", ErrUnavailable, ctxErr)
	}
	return session{}, err
}

// finishClient ends a successful client handshake: it fails if ctx ended
// meanwhile, else it clears the deadlines.
func finishClient(ctx context.Context, nc net.Conn, stop func() bool, s session) (session, error) {
	if !stop() {
		return session{}, fmt.Errorf("%w: handshake: %w", ErrUnavailable, context.Cause(ctx))
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return session{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return s, nil
}

func clientExchange(nc net.Conn, cfg *common, onTLS bool) (session, error) {
	ch := wire.Handshake{Type: wire.MsgClientHello, Version: wire.Version, Flags: helloFlags(cfg, onTLS), MaxFrame: uint32(cfg.maxFrame)}
	if _, err := rand.Read(ch.Nonce[:]); err != nil {
		return session{}, fmt.Errorf("%w: reading random nonce: %w", ErrUnavailable, err)
	}
	rawHello, err := writeMsg(nc, ch)
	if err != nil {
		return session{}, fmt.Errorf("%w: writing client hello: %w", ErrUnavailable, err)
	}
	sh, rawServer, err := readServerMsg(nc)
	if err != nil {
		return session{}, err
	}
	if sh.Type != wire.MsgServerHello {
		return session{}, fmt.Errorf("%w: expected server hello, got message type %d", ErrHandshake, sh.Type)
	}
	if sh.Version != wire.Version {
		return session{}, fmt.Errorf("%w: server speaks protocol version %d", ErrHandshake, sh.Version)
	}
	if err := tlsAgree(onTLS, sh.Flags, "server"); err != nil {
		return session{}, err
	}
	rawProof, err := writeMsg(nc, wire.Handshake{Type: wire.MsgClientProof, Proof: clientProof(cfg.secret, rawHello, rawServer)})
	if err != nil {
		return session{}, fmt.Errorf("%w: writing client proof: %w", ErrUnavailable, err)
	}
	accept, _, err := readServerMsg(nc)
	if err != nil {
		return session{}, err
	}
	if accept.Type != wire.MsgServerProof {
		return session{}, fmt.Errorf("%w: expected server proof, got message type %d", ErrHandshake, accept.Type)
	}
	if !proofsEqual(serverProof(cfg.secret, rawHello, rawServer, rawProof), accept.Proof) {
		return session{}, fmt.Errorf("%w: server proof does not match the cluster secret", ErrAuth)
	}
	sess, err := newSession(cfg, ch, sh, true)
	if err != nil {
		return session{}, fmt.Errorf("%w: deriving session keys: %w", ErrHandshake, err)
	}
	return sess, nil
}

// tlsAgree checks that a peer's hello and this side agree on whether the
// connection runs TLS. They differ when something between the two ends
// terminates TLS; the frames would then travel unprotected on one side.
func tlsAgree(onTLS bool, peer wire.HelloFlags, peerName string) error {
	switch peerTLS := peer&wire.HelloTLS != 0; {
	case peerTLS && !onTLS:
		return fmt.Errorf("%w: the %s is on TLS and this end is not", ErrHandshake, peerName)
	case !peerTLS && onTLS:
		return fmt.Errorf("%w: this end is on TLS and the %s is not", ErrHandshake, peerName)
	}
	return nil
}

// readServerMsg reads one handshake message from the server, turning a
// refusal verdict into its error.
func readServerMsg(nc net.Conn) (wire.Handshake, []byte, error) {
	m, raw, err := wire.ReadHandshake(nc)
	if err != nil {
		if errors.Is(err, wire.ErrMalformed) {
			return m, nil, fmt.Errorf("%w: %w", ErrHandshake, err)
		}
		if _, ok := peerAlert(err); ok {
			// Under TLS 1.3 a server refuses a client's certificate
			// after the client's side of the TLS handshake is done.
			return m, nil, tlsFailure(err)
		}
		return m, nil, fmt.Errorf("%w: handshake: %w", ErrUnavailable, err)
	}
	if m.Type == wire.MsgVerdict {
		return m, nil, verdictError(m.Verdict)
	}
	return m, raw, nil
}

func verdictError(v wire.Verdict) error {
	switch v {
	case wire.VerdictAuthFailed:
		return fmt.Errorf("%w: server refused the cluster secret", ErrAuth)
	case wire.VerdictVersion:
		return fmt.Errorf("%w: server does not support protocol version %d", ErrHandshake, wire.Version)
	case wire.VerdictTLS:
		return fmt.Errorf("%w: one end of the connection runs TLS and the other does not (is TLS terminated on the way?)", ErrHandshake)
	default:
		return fmt.Errorf("%w: verdict %d", ErrHandshake, v)
	}
}
