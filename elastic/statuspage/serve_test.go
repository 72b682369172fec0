package statuspage

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/elastic"
)

var testSecret = []byte("correct horse battery staple, a cluster secret")

func TestToken(t *testing.T) {
	tok := Token(testSecret)
	assert.Len(t, tok, 64, "hex of SHA-256")
	assert.Equal(t, tok, Token(testSecret))
	assert.NotEqual(t, tok, Token([]byte("another secret")))
	assert.NotContains(t, tok, string(testSecret))
}

// get requests path of h with the given header and cookies and returns the response.
func get(t *testing.T, h http.Handler, method, path string, hdr http.Header, body io.Reader) *http.Response {
	t.Helper()
	r := httptest.NewRequest(method, path, body)
	for k, v := range hdr {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Result()
}

func TestHandlerAuth(t *testing.T) {
	p, _, _ := newTestPage(t, Config{Secret: testSecret})
	p.Sample(context.Background())
	h := p.Handler(true)
	bearer := http.Header{"Authorization": {"Bearer " + Token(testSecret)}}

	for _, path := range []string{"/status", "/fragment"} {
		r := get(t, h, "GET", path, nil, nil)
		assert.Equal(t, http.StatusUnauthorized, r.StatusCode, path)
		assert.NotEmpty(t, r.Header.Get("WWW-Authenticate"))
		r = get(t, h, "GET", path, http.Header{"Authorization": {"Bearer " + Token([]byte("wrong"))}}, nil)
		assert.Equal(t, http.StatusUnauthorized, r.StatusCode, path)
		r = get(t, h, "GET", path, bearer, nil)
		assert.Equal(t, http.StatusOK, r.StatusCode, path)
	}
	r := get(t, h, "GET", "/", nil, nil)
	assert.Equal(t, http.StatusSeeOther, r.StatusCode, "a browser is sent to the login form")
	assert.Equal(t, "login", r.Header.Get("Location"), "relative: the handler may be mounted anywhere")
	r = get(t, h, "GET", "/login", nil, nil)
	assert.Equal(t, http.StatusOK, r.StatusCode)
	body, _ := io.ReadAll(r.Body)
	assert.Contains(t, string(body), `<form id="login"`)
	for _, path := range []string{"/static/page.css", "/static/page.js", "/static/favicon.svg"} {
		assert.Equal(t, http.StatusOK, get(t, h, "GET", path, nil, nil).StatusCode, "%s is open: the login form uses it", path)
	}
	assert.Contains(t, r.Header.Get("Content-Security-Policy"), "default-src 'none'")
	assert.Equal(t, "nosniff", r.Header.Get("X-Content-Type-Options"))

	form := func(v string) (http.Header, io.Reader) {
		return http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, strings.NewReader(url.Values{"token": {v}}.Encode())
	}
	hdr, b := form("not it")
	r = get(t, h, "POST", "/login", hdr, b)
	assert.Equal(t, http.StatusUnauthorized, r.StatusCode)
	assert.Empty(t, r.Cookies())
	body, _ = io.ReadAll(r.Body)
	assert.Contains(t, string(body), "neither the token nor the secret")

	for _, typed := range []string{Token(testSecret), string(testSecret)} {
		hdr, b = form(typed)
		r = get(t, h, "POST", "/login", hdr, b)
		require.Equal(t, http.StatusSeeOther, r.StatusCode, "the token or the secret opens the page")
		assert.Equal(t, "./", r.Header.Get("Location"))
		require.Len(t, r.Cookies(), 1)
		c := r.Cookies()[0]
		assert.Equal(t, Token(testSecret), c.Value, "the cookie holds the token, never the secret")
		assert.True(t, c.HttpOnly)
		assert.Equal(t, http.SameSiteStrictMode, c.SameSite)
		r = get(t, h, "GET", "/", http.Header{"Cookie": {c.String()}}, nil)
		assert.Equal(t, http.StatusOK, r.StatusCode)
	}

	open := p.Handler(false)
	assert.Equal(t, http.StatusOK, get(t, open, "GET", "/status", nil, nil).StatusCode)
	assert.Equal(t, http.StatusOK, get(t, open, "GET", "/", nil, nil).StatusCode)
	assert.Equal(t, http.StatusNotFound, get(t, open, "GET", "/nothing", nil, nil).StatusCode)

	// Without a secret, nothing opens a page that requires the token.
	bare, _, _ := newTestPage(t, Config{})
	hb := bare.Handler(true)
	assert.Equal(t, http.StatusUnauthorized, get(t, hb, "GET", "/status", http.Header{"Authorization": {"Bearer " + Token(nil)}}, nil).StatusCode)
	hdr, b = form(Token(nil))
	assert.Equal(t, http.StatusUnauthorized, get(t, hb, "POST", "/login", hdr, b).StatusCode)
	body, _ = io.ReadAll(get(t, hb, "GET", "/login", nil, nil).Body)
	assert.Contains(t, string(body), "without the cluster secret")
}

func TestHandlerContent(t *testing.T) {
	ctx := context.Background()
	p, src, clk := newTestPage(t, Config{})
	h := p.Handler(false)
	body, _ := io.ReadAll(get(t, h, "GET", "/", nil, nil).Body)
	assert.Contains(t, string(body), "Waiting for the first sample")

	p.Sample(ctx)
	p.Observe("loss", 0.69)
	p.ObserveCheckpoint(elastic.CheckpointEvent{Step: 10, Bytes: 1 << 20, Blocked: 2 * time.Millisecond})
	clk.Advance(time.Second)
	src.set(func(st *elastic.Status) {
		st.EpochDone, st.Step = 1000, 40
		st.Migrating = []int{3}
		st.Servers[1].Failed, st.Servers[1].Reason = true, "killed"
	})
	p.Sample(ctx)

	r := get(t, h, "GET", "/", nil, nil)
	require.Equal(t, http.StatusOK, r.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", r.Header.Get("Content-Type"))
	body, _ = io.ReadAll(r.Body)
	page := string(body)
	for _, want := range []string{
		`<main id="main" data-refresh="1000">`,
		`data-servers="2" data-serving="1" data-workers="2" data-step="40" data-slots="8" data-migrating="1"`,
		`<script src="static/page.js" defer></script>`,
		`<path data-owner="ps-0" d="M0 0h1v1h-1zM2 0h1v1h-1zM0 1h1v1h-1zM2 1h1v1h-1z" fill="#0072B2">`,
		`<path class="migrating" d="M3 0h1v1h-1z"`,
		`data-series="throughput" data-points="1"`,
		`data-series="loss" data-points="1"`,
		`failed: killed`,
		`<tr data-step="10">`,
	} {
		assert.Contains(t, page, want)
	}
	frag, _ := io.ReadAll(get(t, h, "GET", "/fragment", nil, nil).Body)
	assert.True(t, strings.HasPrefix(string(frag), `<div id="job"`), "the fragment is the page's changing part alone")
	assert.NotContains(t, string(frag), "<html")

	r = get(t, h, "GET", "/status", nil, nil)
	assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
	var s Snapshot
	require.NoError(t, json.NewDecoder(r.Body).Decode(&s))
	assert.Equal(t, p.Snapshot(), s, "the JSON holds the snapshot, every field")
}

// addrListener is a listener that reports another address than its own: a loopback listener
// standing for one on a public address.
type addrListener struct {
	net.Listener
	addr net.Addr
}

func (l addrListener) Addr() net.Addr { return l.addr }

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:80": true, "127.3.2.1:80": true, "[::1]:80": true, "[::ffff:127.0.0.1]:80": true,
		"0.0.0.0:80": false, "[::]:80": false, "192.0.2.1:80": false, "[2001:db8::1]:80": false,
	} {
		ta, err := net.ResolveTCPAddr("tcp", addr)
		require.NoError(t, err)
		assert.Equal(t, want, loopback(ta), addr)
	}
	assert.False(t, loopback(&net.UnixAddr{Name: "/run/page.sock", Net: "unix"}))
}

func TestServe(t *testing.T) {
	p, _, _ := newTestPage(t, Config{Secret: testSecret, Every: 10 * time.Millisecond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	public := addrListener{Listener: ln, addr: &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 8080}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, public) }()
	base := "http://" + ln.Addr().String() + "/"

	// The page reached through a public address takes the token.
	_, err = Fetch(ctx, base, []byte("wrong"))
	assert.ErrorIs(t, err, ErrUnauthorized)
	s, err := Fetch(ctx, base, testSecret)
	require.NoError(t, err)
	assert.Equal(t, "ctr", s.Status.Job)
	s, err = Fetch(ctx, base+"status", testSecret)
	require.NoError(t, err, "a URL of the status endpoint is read as is")
	assert.False(t, s.At.IsZero(), "Serve samples")
	assert.ErrorIs(t, p.Run(ctx), ErrRunning, "Serve samples: no other loop may")

	// A browser logs in and keeps the cookie.
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	r, err := c.PostForm(base+"login", url.Values{"token": {Token(testSecret)}})
	require.NoError(t, err)
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	assert.Equal(t, http.StatusOK, r.StatusCode, "sent on to the page")
	assert.Contains(t, string(body), `<main id="main"`)

	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
	_, err = net.Dial("tcp", ln.Addr().String())
	assert.Error(t, err, "Serve closed its listener")

	// On loopback the page is open.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { done <- p.Serve(ctx2, ln2) }()
	s, err = Fetch(ctx2, "http://"+ln2.Addr().String(), nil)
	require.NoError(t, err)
	assert.Equal(t, "ctr", s.Status.Job)
	cancel2()
	assert.ErrorIs(t, <-done, context.Canceled)

	// A page without a secret is not served where others reach it.
	bare, _, _ := newTestPage(t, Config{})
	ln3, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	err = bare.Serve(context.Background(), addrListener{Listener: ln3, addr: public.addr})
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

func TestFetchErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/broken/status":
			io.WriteString(w, "{not json")
		default:
			http.Error(w, "no such page", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	_, err := Fetch(ctx, srv.URL+"/broken/", nil)
	assert.ErrorContains(t, err, "decode")
	_, err = Fetch(ctx, srv.URL+"/missing", nil)
	assert.ErrorContains(t, err, "404")
	assert.ErrorContains(t, err, "no such page")
	_, err = Fetch(ctx, "::not a url", nil)
	assert.Error(t, err)
}

// Everything a snapshot holds comes back from its JSON: a status command sees what the page
// shows.
func TestSnapshotJSON(t *testing.T) {
	ctx := context.Background()
	src := &usageSource{fakeSource: fakeSource{st: twoServers()}}
	p, _, clk := newTestPage(t, Config{Source: src})
	p.Sample(ctx)
	ev := elastic.RecoveryEvent{Policy: elastic.Partial, Failed: map[string]string{"ps-1": "killed"}, Replaced: []string{"ps-1"},
		Step: 40, TableVersion: 3, Detected: clk.Now(), Replacement: time.Second, Duration: 2 * time.Second, LostRecords: 7, TrainedRecords: 900}
	clk.Advance(time.Second)
	src.set(func(st *elastic.Status) {
		st.Plan = elastic.Plan{Servers: 3, Workers: 2, Server: elastic.Resources{CPUs: 2, Memory: 1 << 30}}
		st.Repartition = &elastic.RepartitionStatus{Running: true, From: 2, To: 3, SlotsDone: 1, SlotsTotal: 3}
		st.Migrating = []int{1, 5}
		st.Recoveries, st.LastRecovery = 1, &ev
		st.Servers[0].Host, st.Servers[0].CPU, st.Servers[0].ResidentBytes = "node-a", time.Second, 1<<20
		st.EpochDone, st.Step = 500, 9
	})
	p.Observe("auc", 0.75)
	p.ObserveCheckpoint(elastic.CheckpointEvent{Step: 9, Bytes: 10, Full: true, Blocked: time.Millisecond})
	p.ObserveCheckpoint(elastic.CheckpointEvent{Step: 9, Commit: true, Persist: time.Second})
	p.Sample(ctx)

	want := p.Snapshot()
	b, err := json.Marshal(want)
	require.NoError(t, err)
	var got Snapshot
	require.NoError(t, json.Unmarshal(b, &got))
	// What the JSON leaves out on purpose: a recovery's spans (elastic.RecoveryEvent's
	// json:"-" fields), empty here.
	assert.Equal(t, want, got)
	assert.NotEmpty(t, got.Recoveries)
	assert.NotEmpty(t, got.Checkpoints)
	assert.NotNil(t, got.Status.Repartition)
}
