package metrics_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/metrics"
)

// broken is a collector whose one series fails.
type broken struct{ desc *prometheus.Desc }

func (b broken) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }
func (b broken) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(b.desc, errors.New("source unreachable"))
}

func TestHandlerServesDespiteACollectorError(t *testing.T) {
	reg := prometheus.NewRegistry()
	w, err := metrics.NewWorker(metrics.Config{Job: "j", Node: "worker-0"})
	require.NoError(t, err)
	reg.MustRegister(w, broken{prometheus.NewDesc("elasticps_test_broken", "Fails.", nil, nil)})
	w.ObserveStep(metrics.Step{Samples: 5})

	var logged bytes.Buffer
	rec := httptest.NewRecorder()
	metrics.Handler(reg, slog.New(slog.NewTextHandler(&logged, nil))).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, metrics.Path, nil))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, rec.Body.String(), `elasticps_worker_samples_total{node="worker-0",role="worker",training_job="j"} 5`)
	assert.Contains(t, logged.String(), "source unreachable")
}

func TestServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- metrics.Serve(ctx, ln, prometheus.NewRegistry(), nil) }()

	resp, err := http.Get("http://" + ln.Addr().String() + "/other")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "only /metrics is served")
	resp, err = http.Get("http://" + ln.Addr().String() + metrics.Path)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Empty(t, strings.TrimSpace(string(body)), "an empty registry")

	stop()
	require.NoError(t, <-served)
	_, err = net.Dial("tcp", ln.Addr().String())
	assert.Error(t, err, "the listener is closed")

	// A listener that fails makes Serve fail at once.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln.Close()
	assert.Error(t, metrics.Serve(context.Background(), ln, prometheus.NewRegistry(), nil))

	// ListenAndServe takes an address, and fails on a bad one.
	assert.Error(t, metrics.ListenAndServe(context.Background(), "127.0.0.1:-1", prometheus.NewRegistry(), nil))
	ctx, stop = context.WithCancel(context.Background())
	stop()
	assert.NoError(t, metrics.ListenAndServe(ctx, "127.0.0.1:0", prometheus.NewRegistry(), nil), "serves until ctx ends")
}
