package rpc

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/transport"
	"github.com/elasticps/elasticps/internal/wire"
)

// testCA is a certificate authority made for one test; its keys live in
// memory and in the test's temporary directory only.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// files issues a node certificate for hosts (DNS names or IP addresses),
// valid for servers and clients, and writes it, its key and the CA to
// files.
func (ca *testCA) files(t *testing.T, node string, hosts ...string) TLSFiles {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: node},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	f := TLSFiles{
		CertFile: filepath.Join(dir, node+".crt"),
		KeyFile:  filepath.Join(dir, node+".key"),
		CAFile:   filepath.Join(dir, "ca.crt"),
	}
	require.NoError(t, os.WriteFile(f.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(f.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	require.NoError(t, os.WriteFile(f.CAFile, ca.pem, 0o600))
	return f
}

func loadTLS(t *testing.T, f TLSFiles) (server, client *tls.Config) {
	t.Helper()
	server, client, err := f.LoadTLS()
	require.NoError(t, err)
	return server, client
}

// tapProxy forwards connections to target on loopback TCP and records
// every byte in both directions. With a TLS configuration it terminates
// TLS, as a sidecar in front of a server would, and forwards in clear.
type tapProxy struct {
	addr string
	mu   sync.Mutex
	up   bytes.Buffer // client to server
	down bytes.Buffer // server to client
}

func newTapProxy(t *testing.T, target string, terminate *tls.Config) *tapProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	if terminate != nil {
		l = tls.NewListener(l, terminate)
	}
	p := &tapProxy{addr: l.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
	})
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
			copyTo := func(dst, src net.Conn, rec *bytes.Buffer) {
				defer wg.Done()
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if n > 0 {
						p.mu.Lock()
						rec.Write(buf[:n])
						p.mu.Unlock()
						if _, werr := dst.Write(buf[:n]); werr != nil {
							err = werr
						}
					}
					if err != nil {
						_ = dst.Close()
						_ = src.Close()
						return
					}
				}
			}
			wg.Add(2)
			go copyTo(s, c, &p.up)
			go copyTo(c, s, &p.down)
		}
	}()
	return p
}

func (p *tapProxy) recorded() (up, down []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Clone(p.up.Bytes()), bytes.Clone(p.down.Bytes())
}

// Over mutual TLS, calls work, with compression too, and nothing of the
// handshake or the payloads shows on the wire: the first byte is a TLS
// handshake record, and neither the protocol's magic nor a payload
// appears in either direction.
func TestTLSRoundTrip(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	srvTLS, _ := loadTLS(t, ca.files(t, "ps-0", "127.0.0.1"))
	_, cliTLS := loadTLS(t, ca.files(t, "worker-0", "worker-0.example"))
	for _, compress := range []bool{false, true} {
		e := newTCPEnv(t, ServerConfig{TLS: srvTLS, Compression: compress})
		tap := newTapProxy(t, e.addr, nil)
		c := e.client(t, ClientConfig{TLS: cliTLS, Compression: compress})
		// The certificate names 127.0.0.1, the host dialed through the proxy.
		small := []byte("a payload nobody on the path may read")
		large := bytes.Repeat([]byte("a large payload nobody on the path may read "), 4000)
		for _, req := range [][]byte{small, large} {
			resp, err := c.Call(context.Background(), tap.addr, mEcho, req)
			require.NoError(t, err)
			assert.Equal(t, req, resp)
		}
		require.NoError(t, c.Close())
		up, down := tap.recorded()
		require.NotEmpty(t, up)
		assert.Equal(t, byte(0x16), up[0], "a TLS handshake record")
		for _, b := range [][]byte{up, down} {
			assert.NotContains(t, string(b), "ePSw", "the secret handshake travels inside TLS")
			assert.NotContains(t, string(b), "nobody on the path", "payloads travel inside TLS")
		}
		assert.Zero(t, e.srv.Stats().AuthFailures+e.srv.Stats().FailedHandshakes)
	}
}

// A client whose certificate another CA signed is refused before any
// request is read (crypto/tls does not even send it: the server asks for
// one from its CA); so is a server whose certificate another CA signed,
// or one not valid for the host dialed.
func TestTLSRefusesUnknownCertificates(t *testing.T) {
	ca, other := newTestCA(t, "cluster CA"), newTestCA(t, "another CA")
	srvTLS, cliTLS := loadTLS(t, ca.files(t, "node", "127.0.0.1"))
	_, strangerTLS := loadTLS(t, func() TLSFiles {
		f := other.files(t, "stranger", "127.0.0.1")
		f.CAFile = ca.files(t, "unused").CAFile // it trusts the cluster's CA
		return f
	}())
	otherSrvTLS, _ := loadTLS(t, func() TLSFiles {
		f := other.files(t, "impostor", "127.0.0.1")
		f.CAFile = ca.files(t, "unused").CAFile
		return f
	}())
	namedSrvTLS, _ := loadTLS(t, ca.files(t, "named", "ps-0.cluster"))

	t.Run("client from another CA", func(t *testing.T) {
		e := newTCPEnv(t, ServerConfig{TLS: srvTLS})
		c := e.client(t, ClientConfig{TLS: strangerTLS})
		_, err := c.Call(context.Background(), e.addr, mEcho, []byte("x"))
		assert.ErrorIs(t, err, ErrAuth)
		assert.Equal(t, uint64(1), c.Stats().AuthFailures)
		waitFor(t, func() bool { return e.srv.Stats().FailedHandshakes == 1 }, "the server to count the refusal")
		assert.Empty(t, e.handled())
	})
	for _, tc := range []struct {
		name string
		srv  *tls.Config
	}{{"server from another CA", otherSrvTLS}, {"server named otherwise", namedSrvTLS}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTCPEnv(t, ServerConfig{TLS: tc.srv})
			c := e.client(t, ClientConfig{TLS: cliTLS})
			_, err := c.Call(context.Background(), e.addr, mEcho, []byte("x"))
			assert.ErrorIs(t, err, ErrAuth)
			assert.Equal(t, uint64(1), c.Stats().AuthFailures)
			assert.Empty(t, e.handled())
		})
	}
	t.Run("server name given", func(t *testing.T) {
		e := newTCPEnv(t, ServerConfig{TLS: namedSrvTLS})
		named := cliTLS.Clone()
		named.ServerName = "ps-0.cluster"
		c := e.client(t, ClientConfig{TLS: named})
		_, err := c.Call(context.Background(), e.addr, mEcho, []byte("x"))
		assert.NoError(t, err)
	})
}

// The secret handshake still runs inside TLS: a client with a valid
// certificate and the wrong secret is refused.
func TestTLSStillNeedsTheSecret(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	srvTLS, cliTLS := loadTLS(t, ca.files(t, "node", "127.0.0.1"))
	e := newTCPEnv(t, ServerConfig{TLS: srvTLS})
	c := e.client(t, ClientConfig{TLS: cliTLS, Secret: bytes.Repeat([]byte("w"), MinSecretSize)})
	_, err := c.Call(context.Background(), e.addr, mEcho, []byte("x"))
	assert.ErrorIs(t, err, ErrAuth)
	waitFor(t, func() bool { return e.srv.Stats().AuthFailures == 1 }, "the server to count the refusal")
	assert.Empty(t, e.handled())
}

// A connection that is TLS already, from a listener and a Transport that
// wrap, is treated as one made from the configurations; one whose TLS
// configuration does not insist on a client certificate still gets no
// client without a verified one in.
func TestTLSFromListenerAndTransport(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	srvTLS, cliTLS := loadTLS(t, ca.files(t, "node", "127.0.0.1"))
	lax := srvTLS.Clone()
	lax.ClientAuth = tls.VerifyClientCertIfGiven // not mutual: refused by Validate, not by a listener
	srv, err := NewServer(ServerConfig{Secret: testSecret})
	require.NoError(t, err)
	ran := make(chan struct{}, 10)
	require.NoError(t, srv.Register(mEcho, func(_ context.Context, req []byte, resp *Buffer) error {
		ran <- struct{}{}
		_, _ = resp.Write(req)
		return nil
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(tls.NewListener(l, lax)) }()
	defer func() { _ = srv.Close(); <-done }()

	call := func(cfg *tls.Config) error {
		c, err := NewClient(ClientConfig{Secret: testSecret, Transport: tlsTransport{cfg}})
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Call(context.Background(), l.Addr().String(), mEcho, []byte("x"))
		return err
	}
	require.NoError(t, call(cliTLS))
	assert.Len(t, ran, 1)
	anonymous := cliTLS.Clone()
	anonymous.Certificates = nil
	assert.ErrorIs(t, call(anonymous), ErrAuth)
	waitFor(t, func() bool { return srv.Stats().AuthFailures == 1 }, "the server to count the refusal")
	assert.Len(t, ran, 1, "no handler ran for the client without a certificate")
}

// tlsTransport dials TCP and runs TLS with its configuration.
type tlsTransport struct{ cfg *tls.Config }

func (tr tlsTransport) Listen(addr string) (net.Listener, error) { return nil, net.ErrClosed }

func (tr tlsTransport) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return tls.Client(nc, clientTLS(tr.cfg, addr)), nil
}

var _ transport.Transport = tlsTransport{}

// A TLS client and a server without TLS, or the reverse, fail the
// handshake instead of talking.
func TestTLSMismatchRefused(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	srvTLS, cliTLS := loadTLS(t, ca.files(t, "node", "127.0.0.1"))
	t.Run("client on TLS", func(t *testing.T) {
		e := newTCPEnv(t, ServerConfig{})
		c := e.client(t, ClientConfig{TLS: cliTLS, DialTimeout: 2 * time.Second})
		_, err := c.Call(context.Background(), e.addr, mEcho, []byte("x"))
		assert.Error(t, err)
		waitFor(t, func() bool { return e.srv.Stats().FailedHandshakes == 1 }, "the server to count the failure")
		assert.Empty(t, e.handled())
	})
	t.Run("TLS terminated on the way", func(t *testing.T) {
		e := newTCPEnv(t, ServerConfig{})
		sidecar := newTapProxy(t, e.addr, srvTLS)
		c := e.client(t, ClientConfig{TLS: cliTLS})
		_, err := c.Call(context.Background(), sidecar.addr, mEcho, []byte("x"))
		assert.ErrorIs(t, err, ErrHandshake)
		waitFor(t, func() bool { return e.srv.Stats().FailedHandshakes == 1 }, "the server to count the failure")
		assert.Empty(t, e.handled())
	})
	t.Run("server on TLS", func(t *testing.T) {
		e := newTCPEnv(t, ServerConfig{TLS: srvTLS})
		c := e.client(t, ClientConfig{DialTimeout: 2 * time.Second})
		_, err := c.Call(context.Background(), e.addr, mEcho, []byte("x"))
		assert.Error(t, err)
		waitFor(t, func() bool { return e.srv.Stats().FailedHandshakes == 1 }, "the server to count the failure")
		assert.Empty(t, e.handled())
	})
}

func TestTLSConfigValidate(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	srvTLS, cliTLS := loadTLS(t, ca.files(t, "node", "127.0.0.1"))
	lax := srvTLS.Clone()
	lax.ClientAuth = tls.VerifyClientCertIfGiven
	assert.ErrorIs(t, ServerConfig{Secret: testSecret, TLS: lax}.Validate(), ErrInvalidConfig)
	assert.ErrorIs(t, ServerConfig{Secret: testSecret, TLS: &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert}}.Validate(), ErrInvalidConfig)
	anonymous := cliTLS.Clone()
	anonymous.Certificates = nil
	assert.ErrorIs(t, ClientConfig{Secret: testSecret, TLS: anonymous}.Validate(), ErrInvalidConfig)
	blind := cliTLS.Clone()
	blind.InsecureSkipVerify = true
	assert.ErrorIs(t, ClientConfig{Secret: testSecret, TLS: blind}.Validate(), ErrInvalidConfig)
	assert.NoError(t, ServerConfig{Secret: testSecret, TLS: srvTLS}.Validate())
	assert.NoError(t, ClientConfig{Secret: testSecret, TLS: cliTLS}.Validate())

	_, _, err := TLSFiles{CertFile: "x"}.LoadTLS()
	assert.ErrorIs(t, err, ErrInvalidConfig)
	f := ca.files(t, "node", "127.0.0.1")
	require.NoError(t, os.WriteFile(f.CAFile, []byte("not PEM"), 0o600))
	_, _, err = f.LoadTLS()
	assert.Error(t, err)
}

// A client written by hand that disagrees with the server about TLS reads
// the TLS verdict, not another refusal: one on TLS whose hello lacks the
// TLS flag (as if TLS ended before its program), and one on plain TCP
// whose hello claims TLS.
func TestRawClientGetsTLSVerdict(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	srvTLS, cliTLS := loadTLS(t, ca.files(t, "node", "127.0.0.1"))
	for _, tc := range []struct {
		name  string
		srv   *tls.Config
		flags wire.HelloFlags
	}{
		{"TLS server, hello without the flag", srvTLS, 0},
		{"plain server, hello with the flag", nil, wire.HelloTLS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTCPEnv(t, ServerConfig{TLS: tc.srv})
			nc, err := net.Dial("tcp", e.addr)
			require.NoError(t, err)
			if tc.srv != nil {
				nc = tls.Client(nc, clientTLS(cliTLS, e.addr))
			}
			defer nc.Close()
			require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
			hello := wire.Handshake{Type: wire.MsgClientHello, Version: wire.Version, Flags: tc.flags, MaxFrame: wire.DefaultMaxFrameSize}
			_, err = nc.Write(wire.AppendHandshake(nil, hello))
			require.NoError(t, err)
			m, _, err := wire.ReadHandshake(nc)
			require.NoError(t, err)
			assert.Equal(t, wire.MsgVerdict, m.Type)
			assert.Equal(t, wire.VerdictTLS, m.Verdict)
			assert.ErrorIs(t, verdictError(m.Verdict), ErrHandshake)
			waitFor(t, func() bool { return e.srv.Stats().FailedHandshakes == 1 }, "the server to count the refusal")
			assert.Zero(t, e.srv.Stats().AuthFailures)
			assert.Empty(t, e.handled())
		})
	}
}
