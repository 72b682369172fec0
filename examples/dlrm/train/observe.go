package train

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/elastic/statuspage"
)

// watch is what lets a person watch a run: the coordinator's status page. Its methods do
// nothing on a nil or empty watch, so the run calls them whether or not it serves anything.
type watch struct {
	page  atomic.Pointer[statuspage.Page]
	url   string
	token string // what a browser off loopback logs in with
	serving
}

// serving is a server run in the background until close: the status page's, the metrics'.
type serving struct {
	wg   sync.WaitGroup
	stop context.CancelFunc
}

// listen listens on addr and runs serve on the listener until close (not until ctx ends: a
// run's final checkpoint follows an interrupt), logging how it stopped if not by close; what
// names it in errors and logs. It returns the listener's address.
func (s *serving) listen(ctx context.Context, addr, what string, log *slog.Logger, serve func(context.Context, net.Listener) error) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	ctx, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := serve(ctx, ln); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, http.ErrServerClosed) {
			log.Warn(what+" stopped", "err", err)
		}
	}()
	return ln.Addr(), nil
}

// close stops serving and waits for it; it does nothing if nothing was served.
func (s *serving) close() {
	if s.stop != nil {
		s.stop()
		s.wg.Wait()
	}
}

// startPage serves the coordinator's status page on addr (nothing when addr is empty), with
// the token of secret unless addr is loopback, logging to log. The page reads src; it is
// served until close.
func (w *watch) startPage(ctx context.Context, addr string, secret []byte, src statuspage.Source, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	page, err := statuspage.New(statuspage.Config{Source: src, Secret: secret, Logger: log})
	if err != nil {
		return err
	}
	at, err := w.listen(ctx, addr, "status page", log, page.Serve)
	if err != nil {
		return err
	}
	w.page.Store(page)
	w.url = pageURL(at)
	if t, ok := at.(*net.TCPAddr); !ok || !t.IP.IsLoopback() {
		w.token = statuspage.Token(secret)
	}
	return nil
}

// announce says where the page is, in a Note event; with the token off loopback when
// withToken (an embedded run, whose cluster secret nobody else knows: a job of several
// processes logs in with the secret of its secret file).
func (w *watch) announce(emit func(Event), withToken bool) {
	switch {
	case w.url == "":
	case w.token != "" && withToken:
		emit(Event{Kind: EventNote, Message: fmt.Sprintf("status page at %s (its token: %s)", w.url, w.token)})
	default:
		emit(Event{Kind: EventNote, Message: "status page at " + w.url})
	}
}

// pageURL is the address a browser opens for a listener's address.
func pageURL(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok && t.IP.IsUnspecified() {
		return fmt.Sprintf("http://localhost:%d/", t.Port)
	}
	return "http://" + a.String() + "/"
}

// checkpoint, recovery, step and eval hand the run's events to the page.
func (w *watch) checkpoint(ev elastic.CheckpointEvent) {
	if p := w.page.Load(); p != nil {
		p.ObserveCheckpoint(ev)
	}
}

func (w *watch) recovery(ev elastic.RecoveryEvent) {
	if p := w.page.Load(); p != nil {
		p.ObserveRecovery(ev)
	}
}

func (w *watch) step(st stepFigures) {
	if p := w.page.Load(); p != nil {
		p.Observe("loss", st.loss)
	}
}

func (w *watch) eval(ev Eval) {
	if p := w.page.Load(); p != nil {
		p.Observe(ev.Set+" AUC", ev.AUC)
	}
}

// jobSource is the page's view of a local job: its coordinator of the moment.
type jobSource struct{ job *local.Job }

func (s jobSource) Status() elastic.Status { return s.job.Coordinator().Status() }

func (s jobSource) Usage(ctx context.Context) (elastic.Status, error) {
	return s.job.Coordinator().Usage(ctx)
}
