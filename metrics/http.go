package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where Serve answers.
const Path = "/metrics"

// Handler returns the HTTP handler of g's exposition (the text format, or the protobuf one
// when the scraper asks for it). A collector's error is logged to log (nil discards) and the
// other series are served.
func Handler(g prometheus.Gatherer, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: errorLog{log}, ErrorHandling: promhttp.ContinueOnError})
}

// errorLog is promhttp's error log on a slog.Logger.
type errorLog struct{ log *slog.Logger }

func (l errorLog) Println(v ...any) { l.log.Error("metrics: " + fmt.Sprint(v...)) }

// shutdownWait bounds how long Serve waits for scrapes in flight once ctx ends.
const shutdownWait = 5 * time.Second

// Serve serves g's exposition at Path on ln until ctx ends, then closes ln and returns nil
// once the scrapes in flight are done (or shutdownWait has passed). It returns an error if
// serving fails before. Each process serves its own, on an address its flags give.
func Serve(ctx context.Context, ln net.Listener, g prometheus.Gatherer, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.Handle(Path, Handler(g, log))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("metrics: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		srv.Close() // scrapes still in flight: cut them
	}
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("metrics: shut down: %w", err)
	}
	return nil
}

// ListenAndServe listens on addr (host:port, as a program's flag gives it) and serves g's
// exposition there as Serve does, until ctx ends.
func ListenAndServe(ctx context.Context, addr string, g prometheus.Gatherer, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return Serve(ctx, ln, g, log)
}
