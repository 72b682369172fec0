package metrics_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
	"github.com/elasticps/elasticps/metrics"
)

// gather collects c alone and returns its families by name.
func gather(t *testing.T, c prometheus.Collector) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// fakeStatus is a coordinator's status with a different number in every field, so that a
// field read into the wrong series shows.
func fakeStatus() elastic.Status {
	return elastic.Status{Job: "j", Incarnation: 3, Phase: "checkpoint", Plan: elastic.Plan{Servers: 4, Workers: 5},
		TableVersion: 17,
		Servers:      []elastic.ServerStatus{{ID: "ps-0"}, {ID: "ps-1", Silent: true}, {ID: "ps-2", Failed: true}, {ID: "ps-3"}},
		Workers:      []elastic.WorkerStatus{{ID: "worker-0", InBatch: true}, {ID: "worker-1"}, {ID: "worker-2"}},
		Epoch:        1, Epochs: 6, EpochRecords: 1000, EpochDone: 700, EpochGivenUp: 8,
		Step: 123, LastCommit: 120, Snapshots: 11, Commits: 10, CheckpointFailures: 2,
		Fenced: 12, Evicted: 13, ServerFailures: 14, LostRecords: 15,
		Repartition: &elastic.RepartitionStatus{Running: true, From: 3, To: 4, SlotsDone: 19, SlotsTotal: 30, Bytes: 4096},
		Owners:      []string{"ps-0", "ps-0", "ps-1", "ps-0", "ps-1"},
		Migrating:   []int{2, 4},
	}
}

func TestCoordinatorStatusSeries(t *testing.T) {
	st := fakeStatus()
	c, err := metrics.NewCoordinator(metrics.Config{Job: "j"})
	require.NoError(t, err)
	m := gather(t, c)
	assert.NotContains(t, m, "elasticps_coordinator_step", "no source yet")
	assert.Contains(t, m, "elasticps_coordinator_recoveries_total", "the event series are there from the start")

	c.SetSource(metrics.StatusFunc(func() elastic.Status { return st }))
	m = gather(t, c)
	for _, tc := range []struct {
		name string
		kv   []string
		want float64
	}{
		{"elasticps_coordinator_servers", []string{"state", "serving"}, 2},
		{"elasticps_coordinator_servers", []string{"state", "silent"}, 1},
		{"elasticps_coordinator_servers", []string{"state", "failed"}, 1},
		{"elasticps_coordinator_workers", []string{"state", "training"}, 1},
		{"elasticps_coordinator_workers", []string{"state", "waiting"}, 2},
		{"elasticps_coordinator_phase", []string{"phase", "checkpoint"}, 1},
		{"elasticps_coordinator_phase", []string{"phase", "training"}, 0},
		{"elasticps_coordinator_incarnation", nil, 3},
		{"elasticps_coordinator_planned_servers", nil, 4},
		{"elasticps_coordinator_planned_workers", nil, 5},
		{"elasticps_coordinator_owner_table_version", nil, 17},
		{"elasticps_coordinator_step", nil, 123},
		{"elasticps_coordinator_data_epoch", nil, 1},
		{"elasticps_coordinator_data_epochs", nil, 6},
		{"elasticps_coordinator_epoch_records", nil, 1000},
		{"elasticps_coordinator_epoch_trained_records", nil, 700},
		{"elasticps_coordinator_epoch_given_up_records", nil, 8},
		{"elasticps_coordinator_checkpoints_total", []string{"stage", "snapshot"}, 11},
		{"elasticps_coordinator_checkpoints_total", []string{"stage", "commit"}, 10},
		{"elasticps_coordinator_checkpoint_failures_total", nil, 2},
		{"elasticps_coordinator_last_commit_step", nil, 120},
		{"elasticps_coordinator_worker_fences_total", nil, 12},
		{"elasticps_coordinator_worker_failures_total", nil, 13},
		{"elasticps_coordinator_server_failures_total", nil, 14},
		{"elasticps_coordinator_lost_records_total", nil, 15},
		{"elasticps_coordinator_exactly_once_violations", nil, 0},
		{"elasticps_coordinator_owned_slots", []string{"server", "ps-0"}, 3},
		{"elasticps_coordinator_owned_slots", []string{"server", "ps-1"}, 2},
		{"elasticps_coordinator_owned_slots", []string{"server", "ps-3"}, 0}, // serving, owns nothing yet
		{"elasticps_coordinator_migrating_slots", nil, 2},
		{"elasticps_coordinator_repartition_running", nil, 1},
		{"elasticps_coordinator_repartition_slots", []string{"state", "done"}, 19},
		{"elasticps_coordinator_repartition_slots", []string{"state", "todo"}, 11},
		{"elasticps_coordinator_repartition_copied_bytes", nil, 4096},
	} {
		assert.Equal(t, tc.want, value(t, m, tc.name, tc.kv...), "%s%v", tc.name, tc.kv)
	}
	assert.Len(t, m["elasticps_coordinator_owned_slots"].GetMetric(), 3, "a failed server owns no slot and has no series")

	st.ExactlyOnceViolations = 2
	assert.Equal(t, 2.0, value(t, gather(t, c), "elasticps_coordinator_exactly_once_violations"))
}

func TestCoordinatorEvents(t *testing.T) {
	c, err := metrics.NewCoordinator(metrics.Config{Job: "j"})
	require.NoError(t, err)
	var earlier []elastic.CheckpointEvent
	cfg := elastic.Config{OnCheckpoint: func(e elastic.CheckpointEvent) { earlier = append(earlier, e) }}
	c.Hook(&cfg)
	require.NotNil(t, cfg.OnRecovery)

	cfg.OnCheckpoint(elastic.CheckpointEvent{Step: 10, Bytes: 1000, Blocked: 3 * time.Millisecond})
	cfg.OnCheckpoint(elastic.CheckpointEvent{Step: 20, Bytes: 500, Blocked: 5 * time.Millisecond})
	cfg.OnCheckpoint(elastic.CheckpointEvent{Step: 30, Err: errors.New("disk full")})
	cfg.OnCheckpoint(elastic.CheckpointEvent{Step: 10, Commit: true, Persist: 2 * time.Second})
	cfg.OnCheckpoint(elastic.CheckpointEvent{Step: 20, Commit: true, Err: errors.New("persist timed out")})
	assert.Len(t, earlier, 5, "Hook keeps the function OnCheckpoint held")

	cfg.OnRecovery(elastic.RecoveryEvent{Policy: elastic.Partial, Duration: 1500 * time.Millisecond})
	cfg.OnRecovery(elastic.RecoveryEvent{Policy: elastic.Rollback, Duration: 4 * time.Second})
	cfg.OnRecovery(elastic.RecoveryEvent{Policy: elastic.Rollback, Err: errors.New("no commit")})

	c.ObserveDecision(autoscale.Applied{Decision: autoscale.Decision{Kind: autoscale.AddServer}, Took: 3 * time.Second, Moves: 7})
	c.ObserveDecision(autoscale.Applied{Decision: autoscale.Decision{Kind: autoscale.Resize}, Took: time.Second, Err: errors.New("no scaler")})

	m := gather(t, c)
	bl := hist(t, m, "elasticps_coordinator_checkpoint_blocked_seconds")
	assert.Equal(t, uint64(2), bl.GetSampleCount(), "successful snapshots")
	assert.InDelta(t, 0.008, bl.GetSampleSum(), 1e-12)
	pe := hist(t, m, "elasticps_coordinator_checkpoint_persist_seconds")
	assert.Equal(t, uint64(1), pe.GetSampleCount(), "successful commits")
	assert.Equal(t, 2.0, pe.GetSampleSum())
	assert.Equal(t, 1500.0, value(t, m, "elasticps_coordinator_checkpoint_bytes_total"))

	assert.Equal(t, 1.0, value(t, m, "elasticps_coordinator_recoveries_total", "policy", "partial", "result", "ok"))
	assert.Equal(t, 0.0, value(t, m, "elasticps_coordinator_recoveries_total", "policy", "partial", "result", "failed"))
	assert.Equal(t, 1.0, value(t, m, "elasticps_coordinator_recoveries_total", "policy", "rollback", "result", "ok"))
	assert.Equal(t, 1.0, value(t, m, "elasticps_coordinator_recoveries_total", "policy", "rollback", "result", "failed"))
	assert.Equal(t, 4.0, hist(t, m, "elasticps_coordinator_recovery_duration_seconds", "policy", "rollback").GetSampleSum())
	assert.Equal(t, uint64(1), hist(t, m, "elasticps_coordinator_recovery_duration_seconds", "policy", "partial").GetSampleCount())

	assert.Equal(t, 1.0, value(t, m, "elasticps_autoscale_decisions_total", "kind", "add-server", "result", "ok"))
	assert.Equal(t, 1.0, value(t, m, "elasticps_autoscale_decisions_total", "kind", "resize", "result", "failed"))
	assert.Equal(t, 0.0, value(t, m, "elasticps_autoscale_decisions_total", "kind", "rebalance", "result", "ok"))
	assert.Equal(t, 3.0, hist(t, m, "elasticps_autoscale_decision_duration_seconds", "kind", "add-server").GetSampleSum())
	assert.Equal(t, 7.0, value(t, m, "elasticps_autoscale_moved_slots_total"))
}

// The coordinator's progress events carry the checkpoints and recoveries Hook would chain.
func TestCoordinatorObservesProgress(t *testing.T) {
	c, err := metrics.NewCoordinator(metrics.Config{Job: "j"})
	require.NoError(t, err)
	c.ObserveProgress(elastic.ProgressEvent{Kind: elastic.EventStep, Step: 9})
	c.ObserveProgress(elastic.ProgressEvent{Kind: elastic.EventCheckpoint, Checkpoint: elastic.CheckpointEvent{Step: 10, Bytes: 100, Blocked: time.Millisecond}})
	c.ObserveProgress(elastic.ProgressEvent{Kind: elastic.EventCheckpoint, Checkpoint: elastic.CheckpointEvent{Step: 10, Commit: true, Persist: time.Second}})
	c.ObserveProgress(elastic.ProgressEvent{Kind: elastic.EventRecovery, Recovery: elastic.RecoveryEvent{Policy: elastic.Partial, Duration: time.Second}})
	c.ObserveProgress(elastic.ProgressEvent{Kind: elastic.EventMove})
	m := gather(t, c)
	assert.Equal(t, uint64(1), hist(t, m, "elasticps_coordinator_checkpoint_blocked_seconds").GetSampleCount())
	assert.Equal(t, uint64(1), hist(t, m, "elasticps_coordinator_checkpoint_persist_seconds").GetSampleCount())
	assert.Equal(t, 100.0, value(t, m, "elasticps_coordinator_checkpoint_bytes_total"))
	assert.Equal(t, 1.0, value(t, m, "elasticps_coordinator_recoveries_total", "policy", "partial", "result", "ok"))
}
