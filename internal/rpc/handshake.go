package rpc

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/elasticps/elasticps/internal/wire"
)

// Labels keep the two proofs distinct, so a proof seen in one role can never
// be replayed in the other.
const (
	serverProofLabel = "elasticps rpc v1 server proof"
	clientProofLabel = "elasticps rpc v1 client proof"
)

// session is what a handshake agreed on.
type session struct {
	compress bool // both hellos offered s2
	peerMax  int  // the largest payload the peer accepts
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

// serverHandshake authenticates a new connection. It reads only handshake
// messages: no request is read before it returns successfully. Deadlines on
// nc are cleared on success.
//
//  1. client -> ClientHello{version, flags, maxFrame, nonceC}
//  2. server -> ServerHello{version, flags, maxFrame, nonceS,
//     proofS = HMAC(secret, serverLabel || ClientHello || ServerHello minus proofS)}
//  3. client -> ClientProof{proofC = HMAC(secret, clientLabel || ClientHello || ServerHello)}
//  4. server -> Verdict{OK | AuthFailed | Version}
func serverHandshake(nc net.Conn, cfg *common, timeout time.Duration) (session, error) {
	if err := nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		return session{}, &refusal{"set deadline", err}
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
	sh := wire.Handshake{Type: wire.MsgServerHello, Version: wire.Version, MaxFrame: uint32(cfg.maxFrame)}
	if cfg.compression {
		sh.Flags |= wire.HelloCompress
	}
	if _, err := rand.Read(sh.Nonce[:]); err != nil {
		return session{}, &refusal{"reading random nonce", err}
	}
	unsigned := wire.AppendHandshake(nil, sh)
	sh.Proof = prove(cfg.secret, serverProofLabel, rawHello, unsigned[:len(unsigned)-wire.MACSize])
	rawServer, err := writeMsg(nc, sh)
	if err != nil {
		return session{}, &refusal{"writing server hello", err}
	}
	proof, _, err := wire.ReadHandshake(nc)
	if err != nil {
		return session{}, &refusal{"reading client proof", err}
	}
	if proof.Type != wire.MsgClientProof {
		return session{}, &refusal{fmt.Sprintf("expected client proof, got message type %d", proof.Type), nil}
	}
	want := prove(cfg.secret, clientProofLabel, rawHello, rawServer)
	if !hmac.Equal(want[:], proof.Proof[:]) {
		_, _ = writeMsg(nc, wire.Handshake{Type: wire.MsgVerdict, Verdict: wire.VerdictAuthFailed})
		return session{}, &refusal{"client proof does not match the cluster secret", ErrAuth}
	}
	if _, err := writeMsg(nc, wire.Handshake{Type: wire.MsgVerdict, Verdict: wire.VerdictOK}); err != nil {
		return session{}, &refusal{"writing verdict", err}
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return session{}, &refusal{"clear deadline", err}
	}
	return session{
		compress: cfg.compression && hello.Flags&wire.HelloCompress != 0,
		peerMax:  peerLimit(hello.MaxFrame),
	}, nil
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
	s, err := clientExchange(nc, cfg)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrHandshake) {
			return session{}, fmt.Errorf("%w: handshake: %w", ErrUnavailable, ctxErr)
		}
		return session{}, err
	}
	if !stop() {
		return session{}, fmt.Errorf("%w: handshake: %w", ErrUnavailable, context.Cause(ctx))
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return session{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return s, nil
}

func clientExchange(nc net.Conn, cfg *common) (session, error) {
	ch := wire.Handshake{Type: wire.MsgClientHello, Version: wire.Version, MaxFrame: uint32(cfg.maxFrame)}
	if cfg.compression {
		ch.Flags |= wire.HelloCompress
	}
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
	want := prove(cfg.secret, serverProofLabel, rawHello, rawServer[:len(rawServer)-wire.MACSize])
	proof := wire.Handshake{Type: wire.MsgClientProof, Proof: prove(cfg.secret, clientProofLabel, rawHello, rawServer)}
	if !hmac.Equal(want[:], sh.Proof[:]) {
		// Send our proof anyway, so that a server with a different secret
		// logs why it refuses us. It covers our fresh nonce and the whole
		// transcript, so it is worthless anywhere else.
		_, _ = writeMsg(nc, proof)
		return session{}, fmt.Errorf("%w: server proof does not match the cluster secret", ErrAuth)
	}
	if _, err := writeMsg(nc, proof); err != nil {
		return session{}, fmt.Errorf("%w: writing client proof: %w", ErrUnavailable, err)
	}
	v, _, err := readServerMsg(nc)
	if err != nil {
		return session{}, err
	}
	if v.Type != wire.MsgVerdict {
		return session{}, fmt.Errorf("%w: expected verdict, got message type %d", ErrHandshake, v.Type)
	}
	if v.Verdict != wire.VerdictOK {
		return session{}, verdictError(v.Verdict)
	}
	return session{
		compress: cfg.compression && sh.Flags&wire.HelloCompress != 0,
		peerMax:  peerLimit(sh.MaxFrame),
	}, nil
}

// readServerMsg reads one handshake message from the server, turning a
// refusal verdict into its error.
func readServerMsg(nc net.Conn) (wire.Handshake, []byte, error) {
	m, raw, err := wire.ReadHandshake(nc)
	if err != nil {
		if errors.Is(err, wire.ErrMalformed) {
			return m, nil, fmt.Errorf("%w: %w", ErrHandshake, err)
		}
		return m, nil, fmt.Errorf("%w: handshake: %w", ErrUnavailable, err)
	}
	if m.Type == wire.MsgVerdict && m.Verdict != wire.VerdictOK {
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
	default:
		return fmt.Errorf("%w: verdict %d", ErrHandshake, v)
	}
}
