package elastic_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/elastictest"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Status, read in the coordinator's process and over the control protocol, tells the same
// story: servers, workers, data progress, commits, and a server failure and its recovery.
// SetParallelism reaches the scaler from another process and refuses what it cannot do.
func TestStatusAndSetParallelismOverTheControlProtocol(t *testing.T) {
	store := checkpoint.NewMemStorage()
	scaler := elastictest.NewRecorder(elastictest.RecorderConfig{})
	j := startFaultJobWith(t, 3, store, t.TempDir(), func(c *elastic.Config) {
		c.Scaler = scaler.ScalerOnly()
		c.Recovery = elastic.Partial
		c.HealthEvery = 20 * time.Millisecond
		c.ServerTimeout = 200 * time.Millisecond
		c.ReplaceWait = 50 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctl, err := remote.NewControl(remote.Config{Addr: j.addr, Secret: j.secret, Transport: j.net.Host("operator")})
	require.NoError(t, err)
	defer ctl.Close()

	w := j.worker("w0")
	for range 12 {
		require.NoError(t, w.sess.Step(ctx, trainStep))
	}
	step, err := j.coord.Checkpoint(ctx)
	require.NoError(t, err)

	st, err := ctl.Status(ctx)
	require.NoError(t, err)
	local := j.coord.Status()
	assert.Equal(t, "faults", st.Job)
	assert.Equal(t, "training", st.Phase)
	assert.Equal(t, "partial", st.Recovery)
	assert.Equal(t, uint64(12), st.Step)
	assert.Equal(t, step, st.LastCommit)
	assert.Equal(t, 2, st.Commits, "the scheduled one at step 8 and the one asked for")
	assert.Equal(t, uint64(1), st.TableVersion)
	require.Len(t, st.Servers, 3)
	for i, s := range st.Servers {
		assert.Equal(t, local.Servers[i].ID, s.ID)
		assert.Equal(t, local.Servers[i].Incarnation, s.Incarnation)
		assert.False(t, s.Failed)
	}
	require.Len(t, st.Workers, 1)
	assert.Equal(t, "w0", st.Workers[0].ID)
	assert.Equal(t, local.Workers[0].Epoch, st.Workers[0].Epoch)
	assert.Equal(t, int64(12*32), st.EpochDone, "12 batches of 32 records")
	assert.Equal(t, int64(faultRecords), st.EpochRecords)
	assert.Equal(t, faultEpochs, st.Epochs)

	// The scheduler's call, from another process.
	require.NoError(t, ctl.SetParallelism(ctx, 4, 3))
	assert.Equal(t, elastic.Plan{Servers: 3, Workers: 4}, scaler.Plan())
	sized := elastic.Plan{Servers: 3, Workers: 4, Server: elastic.Resources{CPUs: 2, Memory: 8 << 30}, Worker: elastic.Resources{CPUs: 1}}
	require.NoError(t, ctl.SetPlan(ctx, sized))
	require.NoError(t, ctl.SetParallelism(ctx, 4, 3))
	assert.Equal(t, sized, scaler.Plan(), "SetParallelism keeps the sizes")
	assert.Equal(t, "3 servers (2 CPUs, 8.0 GiB), 4 workers (1 CPUs)", sized.String())
	assert.ErrorIs(t, ctl.SetParallelism(ctx, 4, 5), errors.ErrUnsupported, "changing the server count needs a scaler that runs servers")
	assert.ErrorIs(t, ctl.SetParallelism(ctx, -1, 3), elastic.ErrInvalidConfig)
	scaler.Fail(elastictest.OpScale, errors.New("quota exceeded"))
	err = ctl.SetParallelism(ctx, 9, 3)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "quota exceeded")
	st, err = ctl.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, sized, st.Plan, "a plan the scaler refused is not the plan")

	// A server dies; its slots go to the survivors (no replacement comes).
	j.kill(2)
	for j.coord.Status().Recoveries == 0 {
		require.NoError(t, w.sess.Step(ctx, trainStep), "the worker trains through the recovery")
	}
	// A batch in flight at the publication was voided, its worker failed: it joins again at
	// its next step.
	for !slices.Contains(j.coord.Members(), "w0") {
		require.NoError(t, w.sess.Step(ctx, trainStep))
	}
	st, err = ctl.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, st.ServerFailures)
	assert.Equal(t, 1, st.Recoveries)
	require.NotNil(t, st.LastRecovery)
	assert.Equal(t, elastic.Partial, st.LastRecovery.Policy)
	assert.Contains(t, st.LastRecovery.Failed, "ps-2")
	assert.Equal(t, step, st.LastRecovery.Step)
	assert.Equal(t, uint64(2), st.TableVersion)
	var ids []string
	for _, s := range st.Servers {
		ids = append(ids, s.ID)
		assert.False(t, s.Failed)
	}
	assert.Equal(t, []string{"ps-0", "ps-1"}, ids, "the survivors took ps-2's slots: it is no longer in the job")

	var text strings.Builder
	require.NoError(t, st.WriteText(&text))
	for _, want := range []string{"job faults: training", "ps-0", "ps-1", "w0", "last recovery: partial of ps-2 ("} {
		assert.Contains(t, text.String(), want)
	}
	t.Log("\n" + text.String())

	noScaler := startFaultJob(t, 1, nil, t.TempDir())
	assert.ErrorIs(t, noScaler.coord.SetParallelism(ctx, 2, 1), elastic.ErrNoScaler)
	noScaler.coord.Close()
	assert.ErrorIs(t, noScaler.coord.SetParallelism(ctx, 2, 1), elastic.ErrClosed, "a closed coordinator changes no plan")
}

// JobRunning tells fresh servers from servers running a job, and cannot tell while a server it
// needs does not answer.
func TestJobRunning(t *testing.T) {
	ctx := context.Background()
	j := startFaultJob(t, 2, nil, t.TempDir())
	servers := []elastic.ParameterServer{j.locals[0], j.locals[1]}
	running, err := elastic.JobRunning(ctx, servers)
	require.NoError(t, err)
	assert.True(t, running, "the coordinator placed its slots on them")

	fresh := startFaultJobServersOnly(t, 2)
	running, err = elastic.JobRunning(ctx, fresh)
	require.NoError(t, err)
	assert.False(t, running)
	require.NoError(t, fresh[1].(*server.Server).Close())
	_, err = elastic.JobRunning(ctx, fresh)
	assert.ErrorIs(t, err, elastic.ErrClosed, "one server does not answer and the other holds nothing")
	running, err = elastic.JobRunning(ctx, []elastic.ParameterServer{servers[0], fresh[1]})
	require.NoError(t, err)
	assert.True(t, running, "one answer of a running job is enough")
}

// startFaultJobServersOnly makes n fresh servers of the fault tests' model, with no coordinator.
func startFaultJobServersOnly(t *testing.T, n int) []elastic.ParameterServer {
	var out []elastic.ParameterServer
	for i := range n {
		srv, err := ps.NewServer(ps.ServerConfig{ID: elastic.ServerID(i), Secret: []byte("a secret of the fault tests....."), Slots: faultSlots, Tables: []ps.TableSpec{faultTable}})
		require.NoError(t, err)
		t.Cleanup(func() { srv.Close() })
		l, err := server.New(srv, fmt.Sprintf("fresh-%d:1", i), checkpoint.Config{})
		require.NoError(t, err)
		out = append(out, l)
	}
	return out
}

// A worker that cannot reach a server tells the coordinator, which confirms with a health call
// and recovers at once: here the server timeout is an hour, so the health checks alone would
// not fail the server within the test; only the worker's report can have.
func TestWorkersReportAnUnreachableServer(t *testing.T) {
	j := startFaultJobWith(t, 3, checkpoint.NewMemStorage(), t.TempDir(), func(c *elastic.Config) {
		c.Recovery = elastic.Partial
		c.HealthEvery = 50 * time.Millisecond
		c.ServerTimeout = time.Hour
		c.ReplaceWait = 50 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := j.worker("w0")
	for range 10 {
		require.NoError(t, w.sess.Step(ctx, trainStep))
	}
	_, err := j.coord.Checkpoint(ctx)
	require.NoError(t, err)
	j.kill(2)
	for j.coord.Status().Recoveries == 0 {
		require.NoError(t, w.sess.Step(ctx, trainStep), "the worker trains through the recovery")
	}
	// A batch in flight at the publication was voided, its worker failed: it joins again at
	// its next step.
	for !slices.Contains(j.coord.Members(), "w0") {
		require.NoError(t, w.sess.Step(ctx, trainStep))
	}
	rec := j.coord.Status().LastRecovery
	require.Contains(t, rec.Failed, "ps-2")
	assert.Contains(t, rec.Failed["ps-2"], "a worker cannot reach it")
	assert.Empty(t, rec.Replaced, "its slots went to the survivors")
}

// A remote needs a cluster secret of at least 32 bytes, as the wire does.
func TestRemotesRefuseAShortSecret(t *testing.T) {
	_, err := remote.NewControl(remote.Config{Addr: "127.0.0.1:1", Secret: []byte("thirty-one bytes of a secret...")})
	assert.ErrorIs(t, err, elastic.ErrInvalidConfig)
	c, err := remote.NewControl(remote.Config{Addr: "127.0.0.1:1", Secret: []byte("thirty-two bytes of a secret....")})
	require.NoError(t, err)
	c.Close()
}

// A server that stops answering its health checks is shown as such before it is failed (the
// server timeout is an hour here, and no worker reports it): the status does not call a dead
// server serving.
func TestStatusShowsAServerThatStopsAnswering(t *testing.T) {
	j := startFaultJobWith(t, 3, checkpoint.NewMemStorage(), t.TempDir(), func(c *elastic.Config) {
		c.CheckpointEvery = 0
		c.HealthEvery = 50 * time.Millisecond
		c.ServerTimeout = time.Hour
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctl, err := remote.NewControl(remote.Config{Addr: j.addr, Secret: j.secret, Transport: j.net.Host("operator")})
	require.NoError(t, err)
	defer ctl.Close()
	st, err := ctl.Status(ctx)
	require.NoError(t, err)
	require.Len(t, st.Servers, 3)
	for _, s := range st.Servers {
		assert.False(t, s.Failed || s.Silent, "%s just answered", s.ID)
	}

	j.kill(2)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second) // two missed checks take 100 ms
	defer wcancel()
	for {
		st, err = ctl.Status(ctx)
		require.NoError(t, err)
		if i := slices.IndexFunc(st.Servers, func(s elastic.ServerStatus) bool { return s.ID == "ps-2" }); i >= 0 && st.Servers[i].Silent {
			assert.False(t, st.Servers[i].Failed, "the server timeout has not passed")
			assert.Greater(t, st.Servers[i].Unheard, 100*time.Millisecond)
			break
		}
		select {
		case <-wctx.Done():
			t.Fatal("the status never showed the dead server as not answering")
		case <-time.After(10 * time.Millisecond): // the next health check
		}
	}
	var text strings.Builder
	require.NoError(t, st.WriteText(&text))
	for _, line := range strings.Split(text.String(), "\n") {
		if strings.HasPrefix(line, "ps-2 ") {
			assert.Contains(t, line, "not answering")
			assert.NotContains(t, line, "serving")
		}
	}
	assert.Contains(t, text.String(), "ps-2 ")
	t.Log("\n" + text.String())
}
