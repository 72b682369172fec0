package statuspage

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// tokenLabel is what the access token is derived for: no other use of the secret derives the
// same bytes.
const tokenLabel = "elasticps status page"

// cookieName is the cookie the login form sets: it holds the token.
const cookieName = "elasticps_status"

// Token returns the access token of a page served with the cluster secret secret: the hex of
// HMAC-SHA256(secret, "elasticps status page"). A client sends it in the header
// "Authorization: Bearer <token>" (Fetch does); a person types it, or the secret itself when
// it is text, into the page's login form, which keeps it in a cookie. Knowing the token does
// not reveal the secret.
func Token(secret []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(tokenLabel))
	return hex.EncodeToString(m.Sum(nil))
}

// authorized reports whether r carries the page's token, in its Authorization header or its
// cookie. A page without a secret authorizes nothing.
func (p *Page) authorized(r *http.Request) bool {
	if p.token == "" {
		return false
	}
	if h, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && p.isToken(strings.TrimSpace(h)) {
		return true
	}
	c, err := r.Cookie(cookieName)
	return err == nil && p.isToken(c.Value)
}

// isToken compares v with the page's token in constant time.
func (p *Page) isToken(v string) bool {
	return p.token != "" && subtle.ConstantTimeCompare([]byte(v), []byte(p.token)) == 1
}

// accepts reports whether what a person typed into the login form is the token or the
// secret.
func (p *Page) accepts(v string) bool {
	v = strings.TrimSpace(v)
	if v == "" || p.token == "" {
		return false
	}
	// Both comparisons run, so the time taken tells nothing of which one matched.
	a, b := p.isToken(v), p.isToken(Token([]byte(v)))
	return a || b
}

// loopback reports whether a listener's address is a loopback one (127.0.0.0/8, ::1), which
// only this host can reach.
func loopback(addr net.Addr) bool {
	if t, ok := addr.(*net.TCPAddr); ok {
		return t.IP.IsLoopback()
	}
	if addr == nil || addr.Network() != "tcp" && addr.Network() != "tcp4" && addr.Network() != "tcp6" {
		return false
	}
	ap, err := netip.ParseAddrPort(addr.String())
	return err == nil && ap.Addr().Unmap().IsLoopback()
}
