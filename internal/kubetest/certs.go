package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certFiles are the key material the control plane reads, written into one directory.
type certFiles struct {
	caPEM []byte // the CA that signed the serving certificate; clients trust it

	servingCert, servingKey string // the serving certificate for 127.0.0.1, ::1 and localhost
	serviceAccountKey       string // signs ServiceAccount tokens; its public half checks them
}

// writeCerts makes a CA, a serving certificate signed by it, and a ServiceAccount signing key,
// all ECDSA P-256 (cheap to make, accepted by every component), valid for a day.
func writeCerts(dir string) (certFiles, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certFiles{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kubetest-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return certFiles{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return certFiles{}, err
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certFiles{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kubetest-serving"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return certFiles{}, err
	}

	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return certFiles{}, err
	}

	f := certFiles{
		caPEM:             pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		servingCert:       filepath.Join(dir, "serving.crt"),
		servingKey:        filepath.Join(dir, "serving.key"),
		serviceAccountKey: filepath.Join(dir, "service-account.key"),
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), f.caPEM, 0o600); err != nil {
		return certFiles{}, err
	}
	if err := os.WriteFile(f.servingCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return certFiles{}, err
	}
	if err := writeKey(f.servingKey, key); err != nil {
		return certFiles{}, err
	}
	if err := writeKey(f.serviceAccountKey, saKey); err != nil {
		return certFiles{}, err
	}
	return f, nil
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

// serial returns a random 128-bit certificate serial number.
func serial() *big.Int {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return new(big.Int).SetBytes(b)
}

// newToken returns a random bearer token.
func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// writeTokens writes the apiserver's static token file: one line per user, with its groups.
func writeTokens(path string, users []staticUser) error {
	var b []byte
	for _, u := range users {
		b = fmt.Appendf(b, "%s,%s,%s,%q\n", u.token, u.name, u.name, u.groups)
	}
	return os.WriteFile(path, b, 0o600)
}

// staticUser is one line of the static token file.
type staticUser struct {
	token, name, groups string // groups: comma-separated
}
