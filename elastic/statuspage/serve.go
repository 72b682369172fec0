package statuspage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Handler returns the page's HTTP handler, to mount in a program's own server at a path that
// ends in "/" (with http.StripPrefix for a path other than the root):
//
//	GET  /          the page
//	GET  /fragment  the page's changing part, which the page fetches every Config.Every
//	GET  /status    the Snapshot, in JSON (Fetch reads it)
//	GET  /login     the login form; POST sets the cookie
//	GET  /static/   the page's script, style sheet and icon
//
// With requireAuth, every request but the login form's and the static files' must carry the
// token (Token) in its Authorization header or the cookie the login form sets; without, a
// request for the page is sent to the login form, and any other gets 401. A page
// without Config.Secret then refuses every request. Without requireAuth anyone who reaches the
// handler reads the page: only for an address that no other host reaches (Serve decides so
// for a loopback listener).
func (p *Page) Handler(requireAuth bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", p.servePage)
	mux.HandleFunc("GET /fragment", p.serveFragment)
	mux.HandleFunc("GET /status", p.serveStatus)
	mux.HandleFunc("GET /login", p.serveLogin)
	mux.HandleFunc("POST /login", p.login)
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(p.static)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Everything the page loads is its own: no inline script or style, no other origin.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if requireAuth && !open(r) && !p.authorized(r) {
			p.refuse(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// open reports whether r may be served without the token: the login form and the static files.
func open(r *http.Request) bool {
	return r.URL.Path == "/login" || strings.HasPrefix(r.URL.Path, "/static/")
}

// refuse answers a request without the token: a browser asking for the page is sent to
// the login form, anything else gets 401.
func (p *Page) refuse(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	if r.Method == http.MethodGet && r.URL.Path == "/" {
		// Relative, so that it works wherever the handler is mounted.
		w.Header().Set("Location", "login")
		w.WriteHeader(http.StatusSeeOther)
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="elasticps status page"`)
	http.Error(w, "statuspage: the cluster secret's token is needed (Authorization: Bearer <token>)", http.StatusUnauthorized)
}

// loginView is what the login form shows.
type loginView struct {
	Wrong    bool // the token typed was wrong
	NoSecret bool // the page has no secret: nobody can log in
}

func (p *Page) serveLogin(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	p.render(w, http.StatusOK, "login", loginView{NoSecret: p.token == ""})
}

// login checks the token (or secret) typed into the form; if right, it sets the cookie and
// sends the browser to the page.
func (p *Page) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil || !p.accepts(r.PostForm.Get("token")) {
		p.log.Info("statuspage: a login was refused", "remote", r.RemoteAddr)
		w.Header().Set("Cache-Control", "no-store")
		p.render(w, http.StatusUnauthorized, "login", loginView{Wrong: true, NoSecret: p.token == ""})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: p.token, HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil})
	// Relative, so that it works wherever the handler is mounted.
	w.Header().Set("Location", "./")
	w.WriteHeader(http.StatusSeeOther)
}

func (p *Page) servePage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	p.render(w, http.StatusOK, "page", p.view(p.Snapshot()))
}

func (p *Page) serveFragment(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	p.render(w, http.StatusOK, "main", p.view(p.Snapshot()))
}

func (p *Page) serveStatus(w http.ResponseWriter, r *http.Request) {
	b, err := json.Marshal(p.Snapshot())
	if err != nil {
		p.log.Error("statuspage: encode the status", "err", err)
		http.Error(w, "statuspage: the status cannot be encoded", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(b)
}

// render executes the template name into a buffer first, so that a failure sends an error,
// not half a page.
func (p *Page) render(w http.ResponseWriter, code int, name string, data any) {
	var b bytes.Buffer
	if err := p.tmpl.ExecuteTemplate(&b, name, data); err != nil {
		p.log.Error("statuspage: render", "template", name, "err", err)
		http.Error(w, "statuspage: the page cannot be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write(b.Bytes())
}

// Serve serves the page on ln and samples the Source (as Run does) until ctx ends; then it
// closes ln and returns ctx's error. On a loopback listener (127.0.0.0/8, ::1) anyone may read
// the page; on any other address it takes the token (Handler(true)), and without
// Config.Secret Serve fails at once with ErrInvalidConfig. It returns ErrRunning when the page
// samples already, and the server's error if it stops serving on its own.
func (p *Page) Serve(ctx context.Context, ln net.Listener) error {
	requireAuth := !loopback(ln.Addr())
	if requireAuth && p.token == "" {
		ln.Close()
		return fmt.Errorf("%w: a status page on %s, not a loopback address, needs Config.Secret", ErrInvalidConfig, ln.Addr())
	}
	if !p.sampling.CompareAndSwap(false, true) {
		ln.Close()
		return ErrRunning
	}
	defer p.sampling.Store(false)
	srv := &http.Server{
		Handler:           p.Handler(requireAuth),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { p.run(sctx) })
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
		// Requests in flight end with ctx (BaseContext); give them a moment to say so.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		srv.Shutdown(dctx)
		cancel()
		srv.Close()
		err = <-served
	}
	stop()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return ctx.Err()
	}
	return fmt.Errorf("statuspage: serve: %w", err)
}
