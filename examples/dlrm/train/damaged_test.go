package train_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A multi-process job (each role on its own, over TCP on loopback) is restarted with Resume
// after one byte of a chunk of its newest commit was flipped on disk. The servers come back
// empty (their shared memory went with them) and read storage; the coordinator learns from
// their answers that the commit is damaged, restores the one before it, says so with the
// damaged object and where the commit was moved, and the job ends done.
func TestRolesResumeSkipsADamagedCommit(t *testing.T) {
	const deadline = 3 * time.Minute
	tctx, cancelAll := context.WithTimeout(context.Background(), deadline)
	defer cancelAll()
	records := int64(3000)
	base := smallConfig(t, records, 1)
	base.CheckpointEvery = 5
	base.ProgressEvery = 20 * time.Millisecond
	secret := []byte("a cluster secret shared by every process")
	nodes := []ps.Node{{ID: "ps-0", Addr: freeAddr(t)}, {ID: "ps-1", Addr: freeAddr(t)}}
	coordAddr := freeAddr(t)
	role := func(cfg train.Config, id, listen string) train.RoleConfig {
		return train.RoleConfig{Config: cfg, ID: id, Listen: listen, PS: nodes, Dispatcher: coordAddr, Workers: 1, Secret: secret}
	}
	startServers := func(cfg train.Config) (stop func()) {
		ctx, cancel := context.WithCancel(tctx)
		var wg sync.WaitGroup
		errs := make([]error, len(nodes))
		for i, n := range nodes {
			wg.Go(func() {
				errs[i] = train.RunServer(ctx, role(cfg, n.ID, n.Addr))
				if errs[i] != nil {
					cancelAll()
				}
			})
		}
		return sync.OnceFunc(func() {
			cancel()
			wg.Wait()
			for _, err := range errs {
				assert.NoError(t, err)
			}
		})
	}

	stop := startServers(base)
	defer func() { stop() }()
	// runJob runs the coordinator and a worker until both return; a coordinator that fails
	// stops the worker, which would wait for it until the deadline.
	runJob := func(cfg train.Config) (*train.Summary, error, error) {
		wctx, stopWorker := context.WithCancel(tctx)
		defer stopWorker()
		var sum *train.Summary
		var coordErr, workerErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			sum, coordErr = train.RunCoordinator(tctx, role(cfg, "coordinator", coordAddr))
			if coordErr != nil {
				stopWorker()
			}
		})
		wg.Go(func() { _, workerErr = train.RunWorker(wctx, role(base, "worker-0", "")) })
		wg.Wait()
		return sum, coordErr, workerErr
	}
	sum, coordErr, workerErr := runJob(base)
	require.NoError(t, coordErr)
	require.NoError(t, workerErr)
	require.GreaterOrEqual(t, sum.Checkpoints.Committed, 2)
	stop()

	commits, err := filepath.Glob(filepath.Join(base.CheckpointDir, "dlrm", "commits", "*"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(commits), 2)
	newest, prev := filepath.Base(commits[len(commits)-1]), filepath.Base(commits[len(commits)-2])
	chunks, err := filepath.Glob(filepath.Join(base.CheckpointDir, "dlrm", "data", newest, "ps-1", "*", "t*"))
	require.NoError(t, err)
	require.NotEmpty(t, chunks)
	b, err := os.ReadFile(chunks[0])
	require.NoError(t, err)
	b[len(b)/2] ^= 0x04
	require.NoError(t, os.WriteFile(chunks[0], b, 0o644))

	resume := base
	resume.Resume = true
	var mu sync.Mutex
	var warnings []string
	resume.OnEvent = func(ev train.Event) {
		if ev.Kind == train.EventWarning {
			mu.Lock()
			warnings = append(warnings, ev.Message)
			mu.Unlock()
		}
	}
	stop = startServers(resume)
	s, coordErr, workerErr := runJob(resume)
	require.NoError(t, coordErr, "the resume falls back to the commit before the damaged one")
	require.NoError(t, workerErr)
	assert.True(t, s.Resumed)
	prevStep, err := strconv.ParseUint(prev, 10, 64)
	require.NoError(t, err)
	assert.Equal(t, prevStep, s.ResumedStep, "the commit before the damaged one")
	newestStep, err := strconv.ParseUint(newest, 10, 64)
	require.NoError(t, err)
	mu.Lock()
	all := strings.Join(warnings, "\n")
	mu.Unlock()
	assert.Contains(t, all, fmt.Sprintf("resume skipped the commit of step %d", newestStep))
	assert.Contains(t, all, filepath.Base(chunks[0]), "the warning names the damaged object")
	assert.Contains(t, all, filepath.Join(base.CheckpointDir, "dlrm", "quarantine", newest))
	assert.Equal(t, "every epoch done", s.StopReason)
	assert.True(t, s.ExactlyOnce, "the coordinator's ledger: %v", s.Epochs)
	assert.Equal(t, records, s.TotalSamples, "every record trained once")
}
