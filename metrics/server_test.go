package metrics_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/metrics"
	"github.com/elasticps/elasticps/ps"
)

// fakeServer is a server report with a different number in every field, so that a field read
// into the wrong series shows.
func fakeServer() ps.ServerStats {
	return ps.ServerStats{ID: "ps-7", Version: 9,
		RefusedWrongOwner: 4, RefusedMoved: 5, RefusedFenced: 6,
		PullLatency: ps.Histogram{Bounds: []float64{0.001, 0.01}, Counts: []uint64{1, 2, 0}, Count: 3, Sum: 0.015},
		PushLatency: ps.Histogram{Bounds: []float64{0.001, 0.01}, Counts: []uint64{0, 1, 1}, Count: 2, Sum: 0.05},
		Tables:      []ps.TableStats{{Name: "emb", Dim: 4, Rows: 11, MemoryBytes: 1200, Pulls: 3, Pushes: 2, RowsOut: 30, RowsIn: 20, BytesOut: 480, BytesIn: 320}},
		Slots: []ps.SlotStats{
			{Slot: 0, Owned: true, Accesses: 10, Requests: 2, BusyNanos: 1e6},
			{Slot: 1, Owned: true},
			{Slot: 5, Accesses: 40, Requests: 4, BusyNanos: 3e6}, // handed over, still counted
			{Slot: 9, Owned: true, Accesses: 25, Requests: 3, BusyNanos: 2e6},
		}}
}

func TestServerSeries(t *testing.T) {
	stats := fakeServer()
	m, err := metrics.NewServer(metrics.StatsFunc(func(bool) ps.ServerStats { return stats }), metrics.Config{Job: "j", Node: "ps-7", HotSlots: 2})
	require.NoError(t, err)
	l := seriesLabels(metrics.LabelJob, "j", metrics.LabelRole, "ps", metrics.LabelNode, "ps-7")
	want := `
# HELP elasticps_server_requests_total Pull and push requests served, by table.
# TYPE elasticps_server_requests_total counter
elasticps_server_requests_total` + l("op", "pull", "table", "emb") + ` 3
elasticps_server_requests_total` + l("op", "push", "table", "emb") + ` 2
# HELP elasticps_server_rows_total Rows pulled (sent) and pushed (received), by table.
# TYPE elasticps_server_rows_total counter
elasticps_server_rows_total` + l("op", "pull", "table", "emb") + ` 30
elasticps_server_rows_total` + l("op", "push", "table", "emb") + ` 20
# HELP elasticps_server_bytes_total Payload bytes of the rows pulled and pushed, by table.
# TYPE elasticps_server_bytes_total counter
elasticps_server_bytes_total` + l("op", "pull", "table", "emb") + ` 480
elasticps_server_bytes_total` + l("op", "push", "table", "emb") + ` 320
# HELP elasticps_server_request_duration_seconds Serving time of pull and push requests.
# TYPE elasticps_server_request_duration_seconds histogram
elasticps_server_request_duration_seconds_bucket` + l("op", "pull", "le", "0.001") + ` 1
elasticps_server_request_duration_seconds_bucket` + l("op", "pull", "le", "0.01") + ` 3
elasticps_server_request_duration_seconds_bucket` + l("op", "pull", "le", "+Inf") + ` 3
elasticps_server_request_duration_seconds_sum` + l("op", "pull") + ` 0.015
elasticps_server_request_duration_seconds_count` + l("op", "pull") + ` 3
elasticps_server_request_duration_seconds_bucket` + l("op", "push", "le", "0.001") + ` 0
elasticps_server_request_duration_seconds_bucket` + l("op", "push", "le", "0.01") + ` 1
elasticps_server_request_duration_seconds_bucket` + l("op", "push", "le", "+Inf") + ` 2
elasticps_server_request_duration_seconds_sum` + l("op", "push") + ` 0.05
elasticps_server_request_duration_seconds_count` + l("op", "push") + ` 2
# HELP elasticps_server_refused_requests_total Requests refused: wrong_owner (another server's slot), moved (a slot being handed over), fenced (a fenced worker epoch).
# TYPE elasticps_server_refused_requests_total counter
elasticps_server_refused_requests_total` + l("reason", "wrong_owner") + ` 4
elasticps_server_refused_requests_total` + l("reason", "moved") + ` 5
elasticps_server_refused_requests_total` + l("reason", "fenced") + ` 6
# HELP elasticps_server_table_rows Rows a table holds on the server.
# TYPE elasticps_server_table_rows gauge
elasticps_server_table_rows` + l("table", "emb") + ` 11
# HELP elasticps_server_table_memory_bytes Memory a table's rows and optimizer state hold on the server.
# TYPE elasticps_server_table_memory_bytes gauge
elasticps_server_table_memory_bytes` + l("table", "emb") + ` 1200
# HELP elasticps_server_owned_slots Slots the server owns.
# TYPE elasticps_server_owned_slots gauge
elasticps_server_owned_slots` + l() + ` 3
# HELP elasticps_server_owner_table_version Version of the owner table the server serves.
# TYPE elasticps_server_owner_table_version gauge
elasticps_server_owner_table_version` + l() + ` 9
# HELP elasticps_server_hot_slot_rows_total Rows pulled or pushed, of each of the server's hottest slots.
# TYPE elasticps_server_hot_slot_rows_total counter
elasticps_server_hot_slot_rows_total` + l("slot", "5") + ` 40
elasticps_server_hot_slot_rows_total` + l("slot", "9") + ` 25
# HELP elasticps_server_hot_slot_requests_total Requests touching each of the server's hottest slots.
# TYPE elasticps_server_hot_slot_requests_total counter
elasticps_server_hot_slot_requests_total` + l("slot", "5") + ` 4
elasticps_server_hot_slot_requests_total` + l("slot", "9") + ` 3
# HELP elasticps_server_hot_slot_busy_seconds_total Serving time of each of the server's hottest slots (a request's time split over its slots by rows).
# TYPE elasticps_server_hot_slot_busy_seconds_total counter
elasticps_server_hot_slot_busy_seconds_total` + l("slot", "5") + ` 0.003
elasticps_server_hot_slot_busy_seconds_total` + l("slot", "9") + ` 0.002
`
	require.NoError(t, testutil.CollectAndCompare(m, strings.NewReader(want)))

	// The hottest slots are those busiest since the previous scrape: slot 0 serves 100 rows, 5
	// one, 9 none.
	stats.Slots[0].Accesses, stats.Slots[2].Accesses = 110, 41
	hot := `
# HELP elasticps_server_hot_slot_rows_total Rows pulled or pushed, of each of the server's hottest slots.
# TYPE elasticps_server_hot_slot_rows_total counter
elasticps_server_hot_slot_rows_total` + l("slot", "0") + ` 110
elasticps_server_hot_slot_rows_total` + l("slot", "5") + ` 41
`
	require.NoError(t, testutil.CollectAndCompare(m, strings.NewReader(hot), "elasticps_server_hot_slot_rows_total"))
	// Nothing served since: no slot is hot.
	assert.Zero(t, testutil.CollectAndCount(m, "elasticps_server_hot_slot_rows_total"))
	// A restarted server counts from zero again: its counts are all new.
	stats.Slots[3].Accesses = 7
	assert.Equal(t, 1, testutil.CollectAndCount(m, "elasticps_server_hot_slot_rows_total"))
}

func TestServerHotSlotsOff(t *testing.T) {
	stats := fakeServer()
	m, err := metrics.NewServer(metrics.StatsFunc(func(bool) ps.ServerStats { return stats }), metrics.Config{Job: "j", Node: "ps-7", HotSlots: -1})
	require.NoError(t, err)
	assert.Zero(t, testutil.CollectAndCount(m, "elasticps_server_hot_slot_rows_total"))
	assert.Equal(t, 2, testutil.CollectAndCount(m, "elasticps_server_requests_total"))
}

func TestConfigErrors(t *testing.T) {
	_, err := metrics.NewServer(nil, metrics.Config{Job: "j"})
	assert.ErrorIs(t, err, metrics.ErrNilSource)
	_, err = metrics.NewServer(metrics.StatsFunc(func(bool) ps.ServerStats { return ps.ServerStats{} }), metrics.Config{})
	assert.ErrorIs(t, err, metrics.ErrInvalidConfig)
	_, err = metrics.NewCoordinator(metrics.Config{})
	assert.ErrorIs(t, err, metrics.ErrInvalidConfig)
	_, err = metrics.NewWorker(metrics.Config{Job: "j"})
	assert.ErrorIs(t, err, metrics.ErrInvalidConfig, "a worker needs its Node")
	_, err = metrics.NewWorker(metrics.Config{})
	assert.ErrorIs(t, err, metrics.ErrInvalidConfig)
	assert.ErrorIs(t, metrics.RegisterProcess(nil, metrics.Config{}), metrics.ErrInvalidConfig)
}

// seriesLabels returns a function that writes a series' labels as an exposition does: the
// constant labels kv and the series' own, sorted by name.
func seriesLabels(kv ...string) func(own ...string) string {
	return func(own ...string) string {
		all := append(slices.Clone(kv), own...)
		var pairs []string
		for i := 0; i+1 < len(all); i += 2 {
			pairs = append(pairs, all[i]+`="`+all[i+1]+`"`)
		}
		slices.Sort(pairs)
		return "{" + strings.Join(pairs, ",") + "}"
	}
}
