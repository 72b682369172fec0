package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
)

// TLSFiles names the PEM files of one node's mutual TLS identity. Every
// node of a cluster has a certificate signed by a CA in CAFile, valid for
// both server and client authentication.
type TLSFiles struct {
	// CertFile holds this node's certificate, followed by any intermediate
	// certificates.
	CertFile string
	// KeyFile holds the certificate's private key.
	KeyFile string
	// CAFile holds the certificates of the CAs that sign the nodes'
	// certificates: a peer must present a certificate that chains to one.
	CAFile string
	// ServerName, when set, is the name every server's certificate must be
	// valid for, instead of the host of the address dialed (which then must
	// be in the certificate, as a DNS name or an IP address). Set it when
	// all servers share a certificate name and are dialed by IP address.
	ServerName string
}

// LoadTLS reads the files and returns the configurations for a Server
// (ServerConfig.TLS) and a Client (ClientConfig.TLS) of this node: TLS 1.3,
// a certificate required and verified against the CAs in both directions.
// The files are read once; to rotate certificates, load them again and make
// new servers and clients.
func (f TLSFiles) LoadTLS() (server, client *tls.Config, err error) {
	var errs []error
	for _, name := range []struct{ field, path string }{{"CertFile", f.CertFile}, {"KeyFile", f.KeyFile}, {"CAFile", f.CAFile}} {
		if name.path == "" {
			errs = append(errs, fmt.Errorf("TLS %s is required", name.field))
		}
	}
	if len(errs) > 0 {
		return nil, nil, joinProblems(errs)
	}
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("rpc: load TLS certificate: %w", err)
	}
	pem, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, nil, fmt.Errorf("rpc: load TLS CA: %w", err)
	}
	cas := x509.NewCertPool()
	if !cas.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("rpc: load TLS CA: no PEM certificate in %s", f.CAFile)
	}
	server = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    cas,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	client = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      cas,
		ServerName:   f.ServerName,
	}
	return server, client, nil
}

// validateServerTLS reports why c cannot serve mutual TLS.
func validateServerTLS(c *tls.Config) []error {
	if c == nil {
		return nil
	}
	var errs []error
	if c.ClientAuth != tls.RequireAndVerifyClientCert {
		errs = append(errs, fmt.Errorf("TLS ClientAuth is %v; mutual TLS needs RequireAndVerifyClientCert", c.ClientAuth))
	}
	if len(c.Certificates) == 0 && c.GetCertificate == nil && c.GetConfigForClient == nil {
		errs = append(errs, errors.New("TLS has no server certificate"))
	}
	return errs
}

// validateClientTLS reports why c cannot dial mutual TLS.
func validateClientTLS(c *tls.Config) []error {
	if c == nil {
		return nil
	}
	var errs []error
	if c.InsecureSkipVerify {
		errs = append(errs, errors.New("TLS InsecureSkipVerify is set; servers must be verified"))
	}
	if len(c.Certificates) == 0 && c.GetClientCertificate == nil {
		errs = append(errs, errors.New("TLS has no client certificate; mutual TLS needs one"))
	}
	return errs
}

// tls13 returns a copy of c that accepts nothing older than TLS 1.3, or
// nil.
func tls13(c *tls.Config) *tls.Config {
	if c == nil {
		return nil
	}
	c = c.Clone()
	c.MinVersion = max(c.MinVersion, tls.VersionTLS13)
	return c
}

// clientTLS returns the configuration of a TLS connection to addr: c with
// ServerName set to addr's host unless it names one already.
func clientTLS(c *tls.Config, addr string) *tls.Config {
	if c.ServerName != "" {
		return c
	}
	c = c.Clone()
	c.ServerName = addr
	if host, _, err := net.SplitHostPort(addr); err == nil {
		c.ServerName = host
	}
	return c
}

// tlsConn is a connection that runs TLS: a *tls.Conn made by this package
// from ServerConfig.TLS or ClientConfig.TLS, or by the listener or
// Transport the connection came from.
type tlsConn interface {
	HandshakeContext(ctx context.Context) error
	ConnectionState() tls.ConnectionState
}

// handshakeTLS runs the TLS handshake if nc is a TLS connection and checks
// that the peer presented a certificate that was verified, whatever the
// configuration that made nc. It reports whether nc runs TLS. Errors wrap
// ErrAuth (a certificate refused, on either side), ErrHandshake (the peer
// does not speak TLS as configured) or ErrUnavailable.
func handshakeTLS(ctx context.Context, nc net.Conn) (bool, error) {
	tc, ok := nc.(tlsConn)
	if !ok {
		return false, nil
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		return true, tlsFailure(err)
	}
	if len(tc.ConnectionState().VerifiedChains) == 0 {
		return true, errUnverifiedPeer
	}
	return true, nil
}

// errUnverifiedPeer is returned by handshakeTLS when the TLS handshake
// succeeded without verifying the peer's certificate.
var errUnverifiedPeer = fmt.Errorf("%w: TLS peer has no verified certificate; mutual TLS is required", ErrAuth)

// tlsFailure classifies an error of a TLS connection: a certificate that
// failed verification here, or an alert from the peer refusing ours, is
// ErrAuth; a peer that does not speak TLS, or another alert, is
// ErrHandshake; anything else (I/O) is ErrUnavailable.
func tlsFailure(err error) error {
	var verr *tls.CertificateVerificationError
	var rec tls.RecordHeaderError
	alert, isAlert := peerAlert(err)
	switch {
	case errors.As(err, &verr):
		return fmt.Errorf("%w: TLS: %w", ErrAuth, err)
	case isAlert:
		switch alert {
		case 42, 43, 44, 45, 46, 48, 116: // bad, unsupported, revoked, expired, unknown certificate; unknown CA; certificate required
			return fmt.Errorf("%w: TLS: %w", ErrAuth, err)
		}
		return fmt.Errorf("%w: TLS: %w", ErrHandshake, err)
	case errors.As(err, &rec):
		return fmt.Errorf("%w: TLS: %w", ErrHandshake, err)
	}
	return fmt.Errorf("%w: TLS: %w", ErrUnavailable, err)
}

// peerAlert returns the code of the TLS alert the peer sent, if err is
// one. crypto/tls reports a received alert as a *net.OpError with Op
// "remote error" around a value of an unexported uint8 type.
func peerAlert(err error) (uint8, bool) {
	var ae tls.AlertError
	if errors.As(err, &ae) {
		return uint8(ae), true
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return 0, false
	}
	if v := reflect.ValueOf(op.Err); v.Kind() == reflect.Uint8 {
		return uint8(v.Uint()), true
	}
	return 0, false
}

// closeConn closes nc at once. A TLS connection is closed under its TLS
// layer: tls.Conn.Close would first send a close-notify alert, which
// waits for any write in progress to a peer that may never read.
func closeConn(nc net.Conn) error {
	if u, ok := nc.(interface{ NetConn() net.Conn }); ok {
		return u.NetConn().Close()
	}
	return nc.Close()
}
