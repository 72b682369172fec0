package statuspage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// ErrUnauthorized is returned by Fetch when the page refuses the token: the secret is not the
// page's.
var ErrUnauthorized = errors.New("statuspage: unauthorized")

// maxSnapshot bounds the JSON Fetch reads.
const maxSnapshot = 64 << 20

// Fetch reads the Snapshot of the status page at pageURL (the address the page is served at,
// such as "http://10.0.0.5:8080/"; a URL that names its status endpoint is read as is), sending
// the token of secret (Token); an empty secret sends none, for a page on loopback. A page that
// refuses the token fails with ErrUnauthorized. Fetch uses a client of its own, with no proxy;
// ctx bounds it.
func Fetch(ctx context.Context, pageURL string, secret []byte) (Snapshot, error) {
	u, err := url.Parse(pageURL)
	if err != nil {
		return Snapshot{}, fmt.Errorf("statuspage: page address %q: %w", pageURL, err)
	}
	if !strings.HasSuffix(u.Path, "/status") {
		u = u.JoinPath("status")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return Snapshot{}, fmt.Errorf("statuspage: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if len(secret) > 0 {
		req.Header.Set("Authorization", "Bearer "+Token(secret))
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return Snapshot{}, fmt.Errorf("statuspage: fetch %s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return Snapshot{}, fmt.Errorf("statuspage: fetch %s: %s: %w", u.Redacted(), resp.Status, ErrUnauthorized)
	case resp.StatusCode != http.StatusOK:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return Snapshot{}, fmt.Errorf("statuspage: fetch %s: %s: %s", u.Redacted(), resp.Status, strings.TrimSpace(string(msg)))
	}
	var s Snapshot
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxSnapshot)).Decode(&s); err != nil {
		return Snapshot{}, fmt.Errorf("statuspage: decode the status of %s: %w", u.Redacted(), err)
	}
	return s, nil
}
