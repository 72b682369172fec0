package train_test

import (
	"context"
	"errors"
	"fmt"
	dto "github.com/prometheus/client_model/go"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freeAddr returns a loopback address whose port is free now and was not handed out before in
// this test binary: the kernel may give a port just closed to the next listener, and two roles
// of one job given the same port (a server's and a worker's gossip, say) fail to start.
func freeAddr(t *testing.T) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		l.Close()
		if _, taken := handedOut.LoadOrStore(addr, true); !taken {
			return addr
		}
	}
}

// handedOut holds the addresses freeAddr returned.
var handedOut sync.Map

// TestRolesInSeparateRunners runs a job with each role on its own (as separate processes would:
// they share nothing but the addresses, the secret and the checkpoint directory), then resumes
// the finished job's last checkpoint in a second coordinator to check the restore path.
func TestRolesInSeparateRunners(t *testing.T) {
	// A deadline for the whole job, and a failing role stops the others at once: the test fails
	// within seconds rather than waiting for roles that cannot finish without it. A role that
	// ignores its context past the deadline fails the package with every goroutine's stack.
	const deadline = 3 * time.Minute
	tctx, cancelAll := context.WithTimeout(context.Background(), deadline)
	defer cancelAll()
	watchdog := time.AfterFunc(deadline+30*time.Second, func() {
		panic("TestRolesInSeparateRunners: a role did not return after the test's deadline")
	})
	defer watchdog.Stop()
	failed := func(err error) {
		if err != nil {
			cancelAll()
		}
	}
	records := int64(6000)
	base := smallConfig(t, records, 2)
	base.CheckpointEvery = 10
	base.ProgressEvery = 20 * time.Millisecond // the coordinator checks for a checkpoint this often
	secret := []byte("a cluster secret shared by every process")
	nodes := []ps.Node{{ID: "ps-0", Addr: freeAddr(t)}, {ID: "ps-1", Addr: freeAddr(t)}}
	coordAddr := freeAddr(t)
	// Every role serves its metrics; the coordinator's commits have them all scraped, until one
	// finds every role serving (a worker serves once it has joined: the first commits may come
	// before the second worker does).
	metricsAt := map[string]string{}
	for _, id := range []string{"ps-0", "ps-1", "coordinator", "worker-0", "worker-1"} {
		metricsAt[id] = freeAddr(t)
	}
	var scraped map[string]map[string]*dto.MetricFamily
	var scrapeErrs []error
	role := func(id, listen string) train.RoleConfig {
		cfg := base
		cfg.MetricsAddr = metricsAt[id]
		if id == "coordinator" {
			cfg.OnEvent = func(ev train.Event) {
				if ev.Kind != train.EventCommit || (scraped != nil && scrapeErrs == nil) {
					return
				}
				scraped, scrapeErrs = map[string]map[string]*dto.MetricFamily{}, nil
				for id, addr := range metricsAt {
					m, err := scrape("http://" + addr + "/metrics")
					scraped[id] = m
					if err != nil {
						scrapeErrs = append(scrapeErrs, err)
					}
				}
			}
		}
		return train.RoleConfig{Config: cfg, ID: id, Listen: listen, PS: nodes, Dispatcher: coordAddr, Workers: 2, Secret: secret}
	}

	// startServers runs every parameter server until the returned function stops them.
	startServers := func(resume bool) (stop func()) {
		ctx, cancel := context.WithCancel(tctx)
		var wg sync.WaitGroup
		errs := make([]error, len(nodes))
		for i, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rc := role(n.ID, n.Addr)
				rc.Resume = resume
				errs[i] = train.RunServer(ctx, rc)
				failed(errs[i])
			}()
		}
		return func() {
			cancel()
			wg.Wait()
			for _, err := range errs {
				assert.NoError(t, err)
			}
		}
	}
	stopPS := startServers(false)
	defer func() { stopPS() }()

	var sum *train.Summary
	var coordErr error
	var cw sync.WaitGroup
	cw.Add(1)
	go func() {
		defer cw.Done()
		sum, coordErr = train.RunCoordinator(tctx, role("coordinator", coordAddr))
		failed(coordErr)
	}()
	samples := make([]int64, 2)
	werr := make([]error, 2)
	var ww sync.WaitGroup
	for i := range 2 {
		ww.Add(1)
		go func() {
			defer ww.Done()
			samples[i], werr[i] = train.RunWorker(tctx, role(fmt.Sprintf("worker-%d", i), ""))
			failed(werr[i])
		}()
	}
	ww.Wait()
	cw.Wait()
	for _, err := range werr {
		require.NoError(t, err)
	}
	require.NoError(t, coordErr)
	assert.Equal(t, records*2, samples[0]+samples[1], "the workers trained every record once per epoch")
	assert.Equal(t, records*2, sum.TotalSamples, "the dispatcher counted every record once per epoch")
	assert.Equal(t, "every epoch done", sum.StopReason)
	assert.True(t, sum.ExactlyOnce, "the coordinator's ledger: %v", sum.Epochs)
	assert.GreaterOrEqual(t, sum.Checkpoints.Committed, 2, "periodic and final checkpoints")
	assert.Zero(t, sum.Checkpoints.Failed)
	t.Logf("%d checkpoints committed, blocked %v on average", sum.Checkpoints.Committed, sum.Checkpoints.MeanBlocked())
	require.NoError(t, errors.Join(scrapeErrs...))
	require.Len(t, scraped, len(metricsAt), "every role's metrics scraped at a commit")
	own := map[string]string{"ps": "elasticps_server_requests_total", "worker": "elasticps_worker_samples_total", "coordinator": "elasticps_coordinator_step"}
	for id, fams := range scraped {
		r := strings.TrimRight(id, "-0123456789")
		require.Contains(t, fams, own[r], id)
		for _, name := range []string{own[r], "process_cpu_seconds_total"} {
			for _, m := range fams[name].GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				assert.Equal(t, r, labels["role"], "%s %s", id, name)
				assert.Equal(t, id, labels["node"], "%s %s", id, name)
				assert.Equal(t, "dlrm", labels["training_job"], "%s %s", id, name)
			}
		}
	}

	// The servers still run: a coordinator started with Resume takes the job over from its
	// newest commit, leaving their rows alone.
	again := role("coordinator", coordAddr)
	again.Resume = true
	s1, err := train.RunCoordinator(tctx, again)
	require.NoError(t, err)
	assert.True(t, s1.Resumed)
	assert.Equal(t, sum.Checkpoints.LastCommitted, s1.ResumedStep)
	assert.Equal(t, "every epoch done", s1.StopReason, "the restored dispatcher knows the job is done")
	assert.Equal(t, records*2, s1.ResumedSamples, "the commit holds every record trained")
	assert.Equal(t, records*2, s1.TotalSamples)
	assert.Zero(t, s1.Samples, "nothing was left to train")

	// Restarted servers restore it.
	stopPS()
	stopPS = startServers(true)
	s2, err := train.RunCoordinator(tctx, again)
	require.NoError(t, err)
	assert.True(t, s2.Resumed)
	assert.Equal(t, sum.Checkpoints.LastCommitted, s2.ResumedStep, "the takeover had nothing new to commit")
	assert.Equal(t, "every epoch done", s2.StopReason, "the restored dispatcher knows the job is done")
	assert.Equal(t, records*2, s2.ResumedSamples)

	// The embedded mode resumes the same checkpoint: the samples its run description records
	// are every record of both epochs, counted when the final checkpoint was taken, so the
	// summary does not take the difference for held-out or malformed lines.
	stopPS()
	stopPS = func() {}
	emb := base
	emb.Resume = true
	s3, err := train.Run(tctx, emb)
	require.NoError(t, err)
	assert.True(t, s3.Resumed)
	assert.Equal(t, sum.Checkpoints.LastCommitted, s3.ResumedStep)
	assert.Equal(t, records*2, s3.ResumedSamples, "the final commit counted every record trained")
	assert.Zero(t, s3.Samples)
	checkExactlyOnce(t, s3, records, 2)
}

// A scheduler gives a running multi-process job a third server and then drains one of the
// first two, through the coordinator's control port (what `dlrm scale` does), while the workers
// train; the job finishes with every record trained once per epoch.
func TestRolesScaleOutAndIn(t *testing.T) {
	tctx, cancelAll := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancelAll()
	records := int64(40000)
	base := smallConfig(t, records, 2)
	base.CheckpointEvery = 20
	base.ProgressEvery = 20 * time.Millisecond
	secret := []byte("a cluster secret shared by every process")
	nodes := []ps.Node{{ID: "ps-0", Addr: freeAddr(t)}, {ID: "ps-1", Addr: freeAddr(t)}}
	extra := ps.Node{ID: "ps-2", Addr: freeAddr(t)}
	coordAddr := freeAddr(t)
	role := func(id, listen string) train.RoleConfig {
		return train.RoleConfig{Config: base, ID: id, Listen: listen, PS: nodes, Dispatcher: coordAddr, Workers: 2, Secret: secret}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	serve := func(n ps.Node, list []ps.Node) (stop func()) {
		ctx, cancel := context.WithCancel(tctx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rc := role(n.ID, n.Addr)
			rc.PS = list
			assert.NoError(t, train.RunServer(ctx, rc))
		}()
		return cancel
	}
	stop0 := serve(nodes[0], nodes)
	defer stop0()
	defer serve(nodes[1], nodes)()

	var sum *train.Summary
	var coordErr error
	cdone := make(chan struct{})
	go func() {
		defer close(cdone)
		sum, coordErr = train.RunCoordinator(tctx, role("coordinator", coordAddr))
	}()
	var samples [2]atomic.Int64
	var ww sync.WaitGroup
	for i := range 2 {
		ww.Go(func() {
			n, err := train.RunWorker(tctx, role(fmt.Sprintf("worker-%d", i), ""))
			assert.NoError(t, err)
			samples[i].Store(n)
		})
	}
	ctl, err := remote.NewControl(remote.Config{Addr: coordAddr, Secret: secret})
	require.NoError(t, err)
	defer ctl.Close()
	for { // until the job trains: the scheduler looks at its status
		st, err := ctl.Status(tctx)
		if err == nil && st.Step > 20 {
			break
		}
		require.NoError(t, tctx.Err())
		time.Sleep(10 * time.Millisecond)
	}
	defer serve(extra, append(slices.Clone(nodes), extra))()
	require.NoError(t, ctl.AddServers(tctx, extra))
	require.NoError(t, ctl.RemoveServers(tctx, "ps-0"))
	stop0() // the scheduler stops the drained server
	st, err := ctl.Status(tctx)
	require.NoError(t, err)
	require.NotNil(t, st.Repartition)
	assert.Equal(t, 3, st.Repartition.From)
	assert.Equal(t, 2, st.Repartition.To)

	ww.Wait()
	<-cdone
	require.NoError(t, coordErr)
	assert.Equal(t, records*2, samples[0].Load()+samples[1].Load(), "the workers trained every record once per epoch")
	assert.Equal(t, records*2, sum.TotalSamples)
	assert.True(t, sum.ExactlyOnce, "the coordinator's ledger: %v", sum.Epochs)
	assert.Equal(t, "every epoch done", sum.StopReason)
}
