package metrics_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/metrics"
)

// prometheusBinary returns the path of the prometheus server (Debian package prometheus). In
// CI (CI=true) its absence fails the test; elsewhere the test is skipped.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("prometheus")
	if err != nil {
		if _, serr := os.Stat("/usr/bin/prometheus"); serr == nil {
			return "/usr/bin/prometheus"
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("the prometheus server is required in CI (apt-get install prometheus): %v", err)
		}
		t.Skipf("no prometheus server to scrape with (apt-get install prometheus): %v", err)
	}
	return path
}

// promServer is a running Prometheus.
type promServer struct {
	t   *testing.T
	url string
	log *syncBuffer
}

// syncBuffer is a bytes.Buffer that the process's output and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// scrapeEvery is the scrape interval of the test's Prometheus.
const scrapeEvery = 400 * time.Millisecond

// startPrometheus starts Prometheus on a free loopback port with its storage in a temporary
// directory, scraping targets (host:port) every scrapeEvery; it is killed when the test ends.
// Its first scrapes come some five seconds after it starts: Prometheus's target discovery
// hands its targets over at most every five seconds.
func startPrometheus(t *testing.T, bin string, targets ...string) *promServer {
	t.Helper()
	dir := t.TempDir()
	p := &promServer{t: t, log: &syncBuffer{}}
	config := fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
scrape_configs:
  - job_name: elasticps
    static_configs:
      - targets: [%[2]s]
`, scrapeEvery, strings.Join(targets, ", "))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(config), 0o644))

	// The port is picked free, then given to Prometheus: another process may take it between,
	// so a Prometheus that exits at once is started again on another.
	for attempt := 0; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
			"--web.listen-address="+addr, "--log.level=warn")
		cmd.Stdout, cmd.Stderr = p.log, p.log
		require.NoError(t, cmd.Start())
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() {
			cmd.Process.Kill() // the process this test started, by its pid
			<-exited
		})
		p.url = "http://" + addr
		err = p.waitReady(exited)
		if err == nil {
			return p
		}
		if attempt == 2 {
			t.Fatalf("prometheus did not start: %v\n%s", err, p.log.String())
		}
		t.Logf("prometheus did not start, trying another port: %v", err)
	}
}

// waitReady polls /-/ready until Prometheus answers, it exits, or a deadline passes.
func (p *promServer) waitReady(exited <-chan error) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(15 * time.Second)
	for {
		resp, err := http.Get(p.url + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("exited: %v", err)
		case <-deadline:
			return errors.New("not ready in 15s")
		case <-tick.C:
		}
	}
}

// promSample is one series of an instant query's result.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s promSample) value() float64 {
	v, _ := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
	return v
}

// query runs an instant PromQL query; it fails the test on an error, and on any warning or
// info Prometheus attaches (a name it finds suspect, a rate of what is not a counter).
func (p *promServer) query(expr string) []promSample {
	p.t.Helper()
	resp, err := http.PostForm(p.url+"/api/v1/query", url.Values{"query": {expr}})
	require.NoError(p.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(p.t, err)
	var r struct {
		Status    string   `json:"status"`
		Error     string   `json:"error"`
		Warnings  []string `json:"warnings"`
		Infos     []string `json:"infos"`
		ErrorType string   `json:"errorType"`
		Data      struct {
			ResultType string       `json:"resultType"`
			Result     []promSample `json:"result"`
		} `json:"data"`
	}
	require.NoError(p.t, json.Unmarshal(body, &r), "%s", body)
	require.Equal(p.t, "success", r.Status, "%s: %s %s", expr, r.ErrorType, r.Error)
	require.Empty(p.t, r.Warnings, "%s", expr)
	require.Empty(p.t, r.Infos, "%s", expr)
	if r.Data.ResultType != "vector" {
		return nil // a scalar: the dashboard's checks only want it to evaluate
	}
	return r.Data.Result
}

// waitQuery polls expr until ok holds of its result or a deadline passes.
func (p *promServer) waitQuery(expr string, ok func([]promSample) bool) []promSample {
	p.t.Helper()
	tick := time.NewTicker(scrapeEvery / 2)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for {
		res := p.query(expr)
		if ok(res) {
			return res
		}
		select {
		case <-deadline:
			p.t.Fatalf("waiting for %s: still %v\nprometheus says:\n%s", expr, res, p.log.String())
		case <-tick.C:
		}
	}
}

// scrapedTwice holds, of sum_over_time(up[...]), when every target in addrs was scraped
// successfully at least twice.
func scrapedTwice(addrs ...string) func([]promSample) bool {
	return func(res []promSample) bool {
		n := 0
		for _, s := range res {
			if slices.Contains(addrs, s.Metric["instance"]) && s.value() >= 2 {
				n++
			}
		}
		return n == len(addrs)
	}
}

// TestPrometheus has a real Prometheus scrape a running job (one /metrics listener per role, as
// separate processes would have) through a checkpoint and a scale-out from two servers to
// three, and checks with PromQL what it stored.
func TestPrometheus(t *testing.T) {
	bin := prometheusBinary(t)
	tj := startJob(t, jobOptions{records: 1 << 22, shardSize: 1 << 16, batch: 32, pace: 2 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := tj.job.Coordinator()
	require.NoError(t, c.SetParallelism(ctx, 1, 2))
	// ps-2's process is up from the start (it serves its process's series), as one a scaler
	// started would be; it becomes a server of the job at the scale-out.
	addrs := []string{tj.node("coordinator").addr, tj.node("ps-0").addr, tj.node("ps-1").addr, tj.waitNode("worker-0").addr,
		tj.reserve("ps-2", "ps").addr}

	prom := startPrometheus(t, bin, addrs...)
	prom.waitQuery(`sum_over_time(up[1m])`, scrapedTwice(addrs...))

	_, err := c.Checkpoint(ctx)
	require.NoError(t, err)
	prom.waitQuery(`elasticps_coordinator_checkpoints_total{stage="commit"} >= 1`, func(r []promSample) bool { return len(r) == 1 })

	require.NoError(t, c.SetParallelism(ctx, 1, 3))
	require.Len(t, tj.job.Servers, 3)
	tj.addServer(tj.job.Servers[2].Server())
	// The plan changes once the slots have moved: a scrape that sees it sees the move done.
	prom.waitQuery(`elasticps_coordinator_planned_servers == 3`, func(r []promSample) bool { return len(r) == 1 })
	prom.waitQuery(`elasticps_server_owned_slots{node="ps-2"} > 0`, func(r []promSample) bool { return len(r) == 1 })

	one := func(expr string) float64 {
		t.Helper()
		res := prom.query(expr)
		require.Len(t, res, 1, "%s: %v", expr, res)
		return res[0].value()
	}
	// Gauges are read as their newest sample in the last minute: a scrape that times out on a
	// busy machine marks a target's series stale, and an instant query finds none of them until
	// the next scrape.
	last := func(sel string) string { return "last_over_time(" + sel + "[1m])" }
	assert.Positive(t, one(`rate(elasticps_worker_samples_total[1m])`), "the worker trains")
	assert.Len(t, prom.query(`rate(elasticps_worker_samples_total[1m]) > 0`), 1)
	// The servers not failed (serving, or silent a moment on a busy machine): two, then three.
	members := `sum without (state) (elasticps_coordinator_servers{state!="failed"})`
	assert.Equal(t, 2.0, one(`min_over_time(`+members+`[5m:100ms])`), "two servers before")
	assert.Equal(t, 3.0, one(`sum without (state) (`+last(`elasticps_coordinator_servers{state!="failed"}`)+`)`), "three after")
	assert.Equal(t, 2.0, one(`min_over_time(elasticps_coordinator_planned_servers[5m])`))
	assert.Positive(t, one(`max_over_time(elasticps_coordinator_repartition_slots{state="done"}[5m])`), "slots moved")
	assert.Equal(t, 0.0, one(last(`elasticps_coordinator_repartition_slots{state="todo"}`)))
	assert.Equal(t, 64.0, one(`sum(`+last(`elasticps_coordinator_owned_slots`)+`)`))
	assert.Positive(t, one(last(`elasticps_server_owned_slots{node="ps-2"}`)), "the new server owns slots")
	assert.GreaterOrEqual(t, one(last(`elasticps_coordinator_checkpoints_total{stage="commit"}`)), 1.0)
	assert.GreaterOrEqual(t, one(last(`elasticps_coordinator_checkpoint_persist_seconds_count`)), 1.0)
	assert.Equal(t, 0.0, one(`max_over_time(elasticps_coordinator_exactly_once_violations[5m])`))
	assert.Len(t, prom.query(`sum by (op) (rate(elasticps_server_requests_total[1m])) > 0`), 2, "pulls and pushes served")
	p99 := one(`histogram_quantile(0.99, sum by (le) (rate(elasticps_server_request_duration_seconds_bucket[1m])))`)
	assert.Positive(t, p99)
	assert.Less(t, p99, 2.5)
	for _, name := range []string{"process_cpu_seconds_total", "process_resident_memory_bytes"} {
		assert.Len(t, prom.query(last(name)+` > 0`), len(addrs), "every process reports %s", name)
	}

	// Every series Prometheus stored keeps the labels it was exposed with: none collides with
	// a target label (and came out as exported_...).
	series := prom.query(`{__name__=~"elasticps_.+|process_.+|go_.+"}`)
	require.NotEmpty(t, series)
	for _, s := range series {
		assert.Equal(t, jobName, s.Metric[metrics.LabelJob], "%v", s.Metric)
		assert.NotEmpty(t, s.Metric[metrics.LabelRole], "%v", s.Metric)
		assert.NotEmpty(t, s.Metric[metrics.LabelNode], "%v", s.Metric)
		for l := range s.Metric {
			assert.False(t, strings.HasPrefix(l, "exported_"), "%v", s.Metric)
		}
	}

	// The dashboard's every expression evaluates, without a warning, over what was scraped.
	for _, e := range dashboardExprs(t) {
		prom.query(e.instant())
	}

	// Every role's exposition passes promlint.
	for _, id := range tj.nodeIDs() {
		_, text := scrape(t, tj.node(id).addr)
		problems, err := promlint.New(strings.NewReader(text)).Lint()
		require.NoError(t, err)
		assert.Empty(t, problems, "%s", id)
	}
}
