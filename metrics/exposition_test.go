package metrics_test

import (
	"context"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/metrics"
	"github.com/elasticps/elasticps/ps"
)

var (
	counter   = dto.MetricType_COUNTER
	gauge     = dto.MetricType_GAUGE
	histogram = dto.MetricType_HISTOGRAM
)

// families are the package's series by role, with their types: a role's exposition holds
// exactly these (with the Go and process series).
var families = map[string]map[string]dto.MetricType{
	"ps": {
		"elasticps_server_requests_total":              counter,
		"elasticps_server_rows_total":                  counter,
		"elasticps_server_bytes_total":                 counter,
		"elasticps_server_request_duration_seconds":    histogram,
		"elasticps_server_refused_requests_total":      counter,
		"elasticps_server_table_rows":                  gauge,
		"elasticps_server_table_memory_bytes":          gauge,
		"elasticps_server_owned_slots":                 gauge,
		"elasticps_server_owner_table_version":         gauge,
		"elasticps_server_hot_slot_rows_total":         counter,
		"elasticps_server_hot_slot_requests_total":     counter,
		"elasticps_server_hot_slot_busy_seconds_total": counter,
	},
	"worker": {
		"elasticps_worker_step_duration_seconds": histogram,
		"elasticps_worker_samples_total":         counter,
		"elasticps_worker_loss":                  gauge,
	},
	"coordinator": {
		"elasticps_coordinator_servers":                    gauge,
		"elasticps_coordinator_workers":                    gauge,
		"elasticps_coordinator_phase":                      gauge,
		"elasticps_coordinator_incarnation":                gauge,
		"elasticps_coordinator_planned_servers":            gauge,
		"elasticps_coordinator_planned_workers":            gauge,
		"elasticps_coordinator_owner_table_version":        gauge,
		"elasticps_coordinator_step":                       gauge,
		"elasticps_coordinator_data_epoch":                 gauge,
		"elasticps_coordinator_data_epochs":                gauge,
		"elasticps_coordinator_epoch_records":              gauge,
		"elasticps_coordinator_epoch_trained_records":      gauge,
		"elasticps_coordinator_epoch_given_up_records":     gauge,
		"elasticps_coordinator_checkpoints_total":          counter,
		"elasticps_coordinator_checkpoint_failures_total":  counter,
		"elasticps_coordinator_last_commit_step":           gauge,
		"elasticps_coordinator_worker_fences_total":        counter,
		"elasticps_coordinator_worker_failures_total":      counter,
		"elasticps_coordinator_server_failures_total":      counter,
		"elasticps_coordinator_lost_records_total":         counter,
		"elasticps_coordinator_exactly_once_violations":    gauge,
		"elasticps_coordinator_owned_slots":                gauge,
		"elasticps_coordinator_migrating_slots":            gauge,
		"elasticps_coordinator_repartition_running":        gauge,
		"elasticps_coordinator_repartition_slots":          gauge,
		"elasticps_coordinator_repartition_copied_bytes":   gauge,
		"elasticps_coordinator_checkpoint_blocked_seconds": histogram,
		"elasticps_coordinator_checkpoint_persist_seconds": histogram,
		"elasticps_coordinator_checkpoint_bytes_total":     counter,
		"elasticps_coordinator_recoveries_total":           counter,
		"elasticps_coordinator_recovery_duration_seconds":  histogram,
		"elasticps_autoscale_decisions_total":              counter,
		"elasticps_autoscale_decision_duration_seconds":    histogram,
		"elasticps_autoscale_moved_slots_total":            counter,
	},
}

// optional are the families absent until there is something to say: the hottest slots of a
// server that has served nothing (ps-2, which joined after the training), a worker's loss
// before its first step.
var optional = map[string]bool{
	"elasticps_server_hot_slot_rows_total":         true,
	"elasticps_server_hot_slot_requests_total":     true,
	"elasticps_server_hot_slot_busy_seconds_total": true,
	"elasticps_worker_loss":                        true,
}

// processFamilies are series every process has, from RegisterProcess.
var processFamilies = map[string]dto.MetricType{
	"process_cpu_seconds_total":     counter,
	"process_resident_memory_bytes": gauge,
	"process_start_time_seconds":    gauge,
	"go_goroutines":                 gauge,
}

// scraped is one node's exposition.
type scraped struct {
	role string
	mfs  map[string]*dto.MetricFamily
	text string
}

// trainedJob runs a job through: two servers, two workers train 2048 records (64 batches) with
// a checkpoint every 16 steps, a final checkpoint, then a third server joins (2 -> 3, slots
// move). It returns the job and every node's exposition, scraped once the job is quiet.
func trainedJob(t *testing.T) (*testJob, map[string]scraped) {
	tj := startJob(t, jobOptions{records: 2048, shardSize: 256, batch: 32, every: 16})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := tj.job.Coordinator()
	require.NoError(t, c.SetParallelism(ctx, 2, 2))
	require.NoError(t, tj.scaler.Wait(ctx))
	_, err := c.Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, c.SetParallelism(ctx, 2, 3))
	require.Len(t, tj.job.Servers, 3)
	tj.addServer(tj.job.Servers[2].Server())
	require.NoError(t, c.WaitCommits(ctx))
	st := c.Status()
	tj.waitEvents(func(evs []elastic.CheckpointEvent) bool {
		snaps, commits := countEvents(evs)
		return snaps == st.Snapshots && commits == st.Commits
	})
	out := map[string]scraped{}
	for _, id := range tj.nodeIDs() {
		n := tj.node(id)
		mfs, text := scrape(t, n.addr)
		out[id] = scraped{role: n.role, mfs: mfs, text: text}
	}
	return tj, out
}

// countEvents counts the snapshots and the commits that succeeded.
func countEvents(evs []elastic.CheckpointEvent) (snapshots, commits int) {
	for _, e := range evs {
		switch {
		case e.Err != nil:
		case e.Commit:
			commits++
		default:
			snapshots++
		}
	}
	return snapshots, commits
}

// TestExposition checks every role's exposition, parsed with Prometheus's text parser:
// names, types, labels and lint, and values against what the job did.
func TestExposition(t *testing.T) {
	tj, expo := trainedJob(t)
	c := tj.job.Coordinator()
	st := c.Status()
	require.ElementsMatch(t, []string{"coordinator", "ps-0", "ps-1", "ps-2", "worker-0", "worker-1"}, slices.Collect(maps.Keys(expo)))

	t.Run("names types labels lint", func(t *testing.T) {
		for id, s := range expo {
			want := families[s.role]
			for name, mf := range s.mfs {
				typ, ok := want[name]
				if !ok {
					typ, ok = processFamilies[name]
				}
				if !ok && (strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_")) {
					typ, ok = mf.GetType(), true
				}
				if assert.True(t, ok, "%s: unexpected family %s", id, name) {
					assert.Equal(t, typ, mf.GetType(), "%s: type of %s", id, name)
				}
				for _, m := range mf.GetMetric() {
					l := labels(m)
					assert.Equal(t, jobName, l[metrics.LabelJob], "%s: %s", id, name)
					assert.Equal(t, s.role, l[metrics.LabelRole], "%s: %s", id, name)
					assert.Equal(t, id, l[metrics.LabelNode], "%s: %s", id, name)
				}
			}
			for name := range want {
				_, ok := s.mfs[name]
				assert.True(t, ok || optional[name], "%s: no family %s", id, name)
			}
			for name := range processFamilies {
				_, ok := s.mfs[name]
				assert.True(t, ok, "%s: no family %s", id, name)
			}
			problems, err := promlint.New(strings.NewReader(s.text)).Lint()
			require.NoError(t, err)
			assert.Empty(t, problems, "%s: promlint", id)
		}
	})

	t.Run("coordinator", func(t *testing.T) {
		m := expo["coordinator"].mfs
		tj.mu.Lock()
		events := slices.Clone(tj.events)
		tj.mu.Unlock()
		snaps, commits := countEvents(events)
		var bytes int64
		var blocked float64
		for _, e := range events {
			if e.Err == nil && !e.Commit {
				bytes += e.Bytes
				blocked += e.Blocked.Seconds()
			}
		}
		require.Positive(t, st.Commits)
		assert.Equal(t, uint64(64), st.Step, "2048 records in batches of 32")
		assert.Equal(t, float64(st.Commits), value(t, m, "elasticps_coordinator_checkpoints_total", "stage", "commit"))
		assert.Equal(t, float64(st.Snapshots), value(t, m, "elasticps_coordinator_checkpoints_total", "stage", "snapshot"))
		assert.Equal(t, float64(st.CheckpointFailures), value(t, m, "elasticps_coordinator_checkpoint_failures_total"))
		assert.Equal(t, float64(st.LastCommit), value(t, m, "elasticps_coordinator_last_commit_step"))
		assert.Equal(t, uint64(commits), hist(t, m, "elasticps_coordinator_checkpoint_persist_seconds").GetSampleCount())
		bl := hist(t, m, "elasticps_coordinator_checkpoint_blocked_seconds")
		assert.Equal(t, uint64(snaps), bl.GetSampleCount())
		assert.InDelta(t, blocked, bl.GetSampleSum(), 1e-9)
		assert.Positive(t, bytes)
		assert.Equal(t, float64(bytes), value(t, m, "elasticps_coordinator_checkpoint_bytes_total"))

		assert.Equal(t, 3.0, value(t, m, "elasticps_coordinator_servers", "state", "serving"))
		assert.Equal(t, 0.0, value(t, m, "elasticps_coordinator_servers", "state", "failed"))
		assert.Equal(t, 1.0, value(t, m, "elasticps_coordinator_phase", "phase", st.Phase))
		assert.Equal(t, 1.0, sum(m["elasticps_coordinator_phase"]))
		assert.Equal(t, float64(len(st.Workers)), sum(m["elasticps_coordinator_workers"]))
		assert.Equal(t, 3.0, value(t, m, "elasticps_coordinator_planned_servers"))
		assert.Equal(t, 2.0, value(t, m, "elasticps_coordinator_planned_workers"))
		assert.Equal(t, float64(st.TableVersion), value(t, m, "elasticps_coordinator_owner_table_version"))
		assert.Equal(t, float64(st.Step), value(t, m, "elasticps_coordinator_step"))
		assert.Equal(t, float64(st.EpochRecords), value(t, m, "elasticps_coordinator_epoch_records"))
		assert.Equal(t, float64(st.EpochDone), value(t, m, "elasticps_coordinator_epoch_trained_records"))
		assert.Equal(t, float64(st.Epochs), value(t, m, "elasticps_coordinator_data_epochs"))
		assert.Equal(t, 0.0, value(t, m, "elasticps_coordinator_exactly_once_violations"))
		assert.Zero(t, st.ExactlyOnceViolations)

		owners := map[string]int{}
		for _, id := range st.Owners {
			owners[id]++
		}
		require.Len(t, owners, 3)
		for id, n := range owners {
			assert.Equal(t, float64(n), value(t, m, "elasticps_coordinator_owned_slots", "server", id), id)
		}
		r := st.Repartition
		require.NotNil(t, r)
		require.Positive(t, r.SlotsDone)
		assert.Equal(t, float64(r.SlotsDone), value(t, m, "elasticps_coordinator_repartition_slots", "state", "done"))
		assert.Equal(t, 0.0, value(t, m, "elasticps_coordinator_repartition_slots", "state", "todo"))
		assert.Equal(t, 0.0, value(t, m, "elasticps_coordinator_repartition_running"))
		assert.Equal(t, float64(r.Bytes), value(t, m, "elasticps_coordinator_repartition_copied_bytes"))
		assert.Equal(t, 0.0, value(t, m, "elasticps_coordinator_migrating_slots"))
		assert.Equal(t, 0.0, sum(m["elasticps_coordinator_recoveries_total"]))
	})

	t.Run("servers", func(t *testing.T) {
		var pushes float64
		for i, s := range tj.job.Servers {
			id := elastic.ServerID(i)
			m := expo[id].mfs
			stats := s.Server().Stats(false) // the job is quiet: the same counters as scraped
			require.NotEmpty(t, stats.Tables)
			for _, tb := range stats.Tables {
				for op, want := range map[string][3]uint64{metrics.OpPull: {tb.Pulls, tb.RowsOut, tb.BytesOut}, metrics.OpPush: {tb.Pushes, tb.RowsIn, tb.BytesIn}} {
					assert.Equal(t, float64(want[0]), value(t, m, "elasticps_server_requests_total", "op", op, "table", tb.Name), id)
					assert.Equal(t, float64(want[1]), value(t, m, "elasticps_server_rows_total", "op", op, "table", tb.Name), id)
					assert.Equal(t, float64(want[2]), value(t, m, "elasticps_server_bytes_total", "op", op, "table", tb.Name), id)
				}
				assert.Equal(t, float64(tb.Rows), value(t, m, "elasticps_server_table_rows", "table", tb.Name), id)
				assert.Equal(t, float64(tb.MemoryBytes), value(t, m, "elasticps_server_table_memory_bytes", "table", tb.Name), id)
				pushes += float64(tb.Pushes)
			}
			for op, h := range map[string]ps.Histogram{metrics.OpPull: stats.PullLatency, metrics.OpPush: stats.PushLatency} {
				got := hist(t, m, "elasticps_server_request_duration_seconds", "op", op)
				assert.Equal(t, h.Count, got.GetSampleCount(), id)
				assert.InDelta(t, h.Sum, got.GetSampleSum(), 1e-9, id)
				var cum uint64
				buckets := got.GetBucket()
				require.Len(t, buckets, len(h.Bounds)+1, "%s: the bounds and +Inf", id)
				for j, b := range buckets {
					cum += h.Counts[j]
					if j < len(h.Bounds) {
						assert.Equal(t, h.Bounds[j], b.GetUpperBound(), id)
					} else {
						assert.True(t, math.IsInf(b.GetUpperBound(), 1), id)
					}
					assert.Equal(t, cum, b.GetCumulativeCount(), id)
				}
				assert.Equal(t, h.Count, cum, id)
			}
			for reason, n := range map[string]uint64{metrics.ReasonWrongOwner: stats.RefusedWrongOwner, metrics.ReasonMoved: stats.RefusedMoved, metrics.ReasonFenced: stats.RefusedFenced} {
				assert.Equal(t, float64(n), value(t, m, "elasticps_server_refused_requests_total", "reason", reason), id)
			}
			owned := 0
			for _, sl := range stats.Slots {
				if sl.Owned {
					owned++
				}
			}
			assert.Equal(t, float64(owned), value(t, m, "elasticps_server_owned_slots"), id)
			assert.Equal(t, value(t, expo["coordinator"].mfs, "elasticps_coordinator_owned_slots", "server", id), float64(owned), id)
			assert.Equal(t, float64(stats.Version), value(t, m, "elasticps_server_owner_table_version"), id)

			// At a server's first scrape its hottest slots are those that served the most rows.
			hot := slices.Clone(stats.Slots)
			hot = slices.DeleteFunc(hot, func(s ps.SlotStats) bool { return s.Accesses == 0 })
			slices.SortStableFunc(hot, func(a, b ps.SlotStats) int { return int(b.Accesses) - int(a.Accesses) })
			hot = hot[:min(len(hot), 8)]
			got := m["elasticps_server_hot_slot_rows_total"].GetMetric()
			require.Len(t, got, len(hot), id)
			for _, sl := range hot {
				slot := strconv.Itoa(sl.Slot)
				assert.Equal(t, float64(sl.Accesses), value(t, m, "elasticps_server_hot_slot_rows_total", "slot", slot), id)
				assert.Equal(t, float64(sl.Requests), value(t, m, "elasticps_server_hot_slot_requests_total", "slot", slot), id)
				assert.Equal(t, time.Duration(sl.BusyNanos).Seconds(), value(t, m, "elasticps_server_hot_slot_busy_seconds_total", "slot", slot), id)
			}
		}
		assert.Positive(t, pushes)
	})

	t.Run("workers", func(t *testing.T) {
		var samples, steps float64
		for _, id := range []string{"worker-0", "worker-1"} {
			m := expo[id].mfs
			tj.mu.Lock()
			ws := *tj.workers[id]
			tj.mu.Unlock()
			assert.Equal(t, float64(ws.samples), value(t, m, "elasticps_worker_samples_total"), id)
			for _, phase := range []string{metrics.PhasePull, metrics.PhaseCompute, metrics.PhasePush} {
				assert.Equal(t, uint64(ws.steps), hist(t, m, "elasticps_worker_step_duration_seconds", "phase", phase).GetSampleCount(), id)
			}
			assert.Equal(t, ws.loss, value(t, m, "elasticps_worker_loss"), id)
			samples += value(t, m, "elasticps_worker_samples_total")
			steps += float64(hist(t, m, "elasticps_worker_step_duration_seconds", "phase", metrics.PhasePush).GetSampleCount())
		}
		assert.Equal(t, 2048.0, samples, "every record trained once")
		assert.Equal(t, float64(st.Step), steps)
	})

	t.Run("process", func(t *testing.T) {
		for id, s := range expo {
			assert.Positive(t, value(t, s.mfs, "process_cpu_seconds_total"), id)
			assert.Positive(t, value(t, s.mfs, "process_resident_memory_bytes"), id)
			assert.Positive(t, value(t, s.mfs, "go_goroutines"), id)
		}
	})
}

// labels returns a series' labels.
func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// find returns the one series of family name whose labels include the pairs kv.
func find(t *testing.T, mfs map[string]*dto.MetricFamily, name string, kv ...string) *dto.Metric {
	t.Helper()
	mf := mfs[name]
	require.NotNil(t, mf, "no family %s", name)
	var found *dto.Metric
	for _, m := range mf.GetMetric() {
		l := labels(m)
		ok := true
		for i := 0; i+1 < len(kv); i += 2 {
			ok = ok && l[kv[i]] == kv[i+1]
		}
		if ok {
			require.Nil(t, found, "%s%v: more than one series", name, kv)
			found = m
		}
	}
	require.NotNil(t, found, "%s%v: no series", name, kv)
	return found
}

// value returns the value of a counter or gauge series.
func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string, kv ...string) float64 {
	t.Helper()
	m := find(t, mfs, name, kv...)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	t.Fatalf("%s%v is neither a counter nor a gauge", name, kv)
	return 0
}

// hist returns a histogram series.
func hist(t *testing.T, mfs map[string]*dto.MetricFamily, name string, kv ...string) *dto.Histogram {
	t.Helper()
	h := find(t, mfs, name, kv...).GetHistogram()
	require.NotNil(t, h, "%s%v is not a histogram", name, kv)
	return h
}

// sum adds the values of a family's counter and gauge series.
func sum(mf *dto.MetricFamily) float64 {
	var s float64
	for _, m := range mf.GetMetric() {
		s += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return s
}
