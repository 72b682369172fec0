package wire

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleHandshakes() []Handshake {
	var nonce, proof [32]byte
	for i := range nonce {
		nonce[i] = byte(i)
		proof[i] = byte(255 - i)
	}
	return []Handshake{
		{Type: MsgClientHello, Version: Version, Flags: HelloCompress | HelloEncrypt, MaxFrame: 1 << 20, Nonce: nonce},
		{Type: MsgServerHello, Version: Version, Flags: HelloUnprotected, MaxFrame: 64 << 20, Nonce: nonce},
		{Type: MsgServerHello, Version: Version, Flags: HelloTLS | HelloCompress, MaxFrame: 64 << 20, Nonce: nonce},
		{Type: MsgClientProof, Proof: proof},
		{Type: MsgVerdict, Verdict: VerdictAuthFailed},
		{Type: MsgVerdict, Verdict: VerdictVersion},
		{Type: MsgVerdict, Verdict: VerdictTLS},
		{Type: MsgServerProof, Proof: proof},
	}
}

func TestHandshakeRoundTrip(t *testing.T) {
	var stream []byte
	for _, m := range sampleHandshakes() {
		b := AppendHandshake(nil, m)
		require.Len(t, b, HandshakeSize(m.Type))
		got, rest, err := DecodeHandshake(b)
		require.NoError(t, err)
		assert.Empty(t, rest)
		assert.Equal(t, m, got)
		stream = append(stream, b...)
	}
	r := bytes.NewReader(stream)
	for _, m := range sampleHandshakes() {
		got, raw, err := ReadHandshake(r)
		require.NoError(t, err)
		assert.Equal(t, m, got)
		assert.Equal(t, AppendHandshake(nil, m), raw)
	}
	_, _, err := ReadHandshake(r)
	assert.ErrorIs(t, err, io.EOF)
}

func TestHandshakeSizes(t *testing.T) {
	assert.Equal(t, 45, HandshakeSize(MsgClientHello))
	assert.Equal(t, 45, HandshakeSize(MsgServerHello))
	assert.Equal(t, 37, HandshakeSize(MsgClientProof))
	assert.Equal(t, 9, HandshakeSize(MsgVerdict))
	assert.Equal(t, 37, HandshakeSize(MsgServerProof))
	assert.Zero(t, HandshakeSize(0))
	assert.Empty(t, AppendHandshake(nil, Handshake{Type: 9}))
}

func TestHandshakeRejects(t *testing.T) {
	hello := AppendHandshake(nil, sampleHandshakes()[0])
	mut := func(i int, v byte) []byte {
		b := bytes.Clone(hello)
		b[i] = v
		return b
	}
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"bad magic", mut(0, 'x'), ErrMalformed},
		{"unknown type", mut(4, 9), ErrMalformed},
		{"unknown flags", mut(6, 0x80), ErrMalformed},
		{"encrypt and unprotected", mut(6, byte(HelloEncrypt|HelloUnprotected)), ErrMalformed},
		{"TLS and encrypt", mut(6, byte(HelloTLS|HelloEncrypt)), ErrMalformed},
		{"TLS and unprotected", mut(6, byte(HelloTLS|HelloUnprotected)), ErrMalformed},
		{"reserved", mut(7, 1), ErrMalformed},
		{"short", hello[:44], ErrTruncated},
		{"prefix only", hello[:3], ErrTruncated},
		{"bad verdict", append([]byte(Magic), 4, 4, 0, 0, 0), ErrMalformed},
		{"verdict zero", append([]byte(Magic), 4, 0, 0, 0, 0), ErrMalformed},
		{"verdict reserved", append([]byte(Magic), 4, 1, 0, 1, 0), ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := DecodeHandshake(c.in)
			assert.ErrorIs(t, err, c.want)
			_, _, err = ReadHandshake(bytes.NewReader(c.in))
			assert.ErrorIs(t, err, c.want)
		})
	}
}

func TestReadHandshakeReadsNoMore(t *testing.T) {
	proof := AppendHandshake(nil, Handshake{Type: MsgClientProof})
	r := bytes.NewReader(append(proof, "frames follow"...))
	_, _, err := ReadHandshake(r)
	require.NoError(t, err)
	rest, _ := io.ReadAll(r)
	assert.Equal(t, "frames follow", string(rest))
}
