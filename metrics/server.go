package metrics

import (
	"cmp"
	"github.com/elasticps/elasticps/elastic"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/elasticps/elasticps/ps"
)

// StatsSource is what a Server reads at each scrape: *ps.Server, or a StatsFunc. Stats is
// called with false (no per-slot row counts, which visit every row).
type StatsSource interface {
	Stats(withRows bool) ps.ServerStats
}

var _ StatsSource = (*ps.Server)(nil)

// StatsFunc is a StatsSource that calls itself: say, one that reads the current incarnation of
// a server that may be restarted.
type StatsFunc func(withRows bool) ps.ServerStats

// Stats implements StatsSource.
func (f StatsFunc) Stats(withRows bool) ps.ServerStats { return f(withRows) }

// Operations, the values of the label op.
const (
	OpPull = "pull"
	OpPush = "push"
)

// Reasons a server refuses a request, the values of the label reason.
const (
	ReasonWrongOwner = "wrong_owner" // the slot is another server's
	ReasonMoved      = "moved"       // the slot is being handed over
	ReasonFenced     = "fenced"      // the worker's fence epoch was refused
)

// Server is a parameter server's metrics: a prometheus.Collector that reads the server's
// counters (ps.Server.Stats) at each scrape. Safe for concurrent use. Its series:
//
//	elasticps_server_requests_total{op,table}            counter    pull and push requests served
//	elasticps_server_rows_total{op,table}                counter    rows pulled (sent) and pushed (received)
//	elasticps_server_bytes_total{op,table}               counter    payload bytes of those rows
//	elasticps_server_request_duration_seconds{op}        histogram  serving time of pull and push requests
//	elasticps_server_refused_requests_total{reason}      counter    requests refused: wrong_owner, moved, fenced
//	elasticps_server_table_rows{table}                   gauge      rows held
//	elasticps_server_table_memory_bytes{table}           gauge      memory the table's rows and optimizer state hold
//	elasticps_server_owned_slots                         gauge      slots the server owns
//	elasticps_server_owner_table_version                 gauge      version of the owner table it serves
//	elasticps_server_hot_slot_rows_total{slot}           counter    rows pulled or pushed, of each of the hottest slots
//	elasticps_server_hot_slot_requests_total{slot}       counter    requests touching each of the hottest slots
//	elasticps_server_hot_slot_busy_seconds_total{slot}   counter    serving time of each of the hottest slots
//
// The hottest slots are the Config.HotSlots slots with the most rows served since the previous
// scrape (at the first, since the server started), busiest first; a slot that cools leaves
// the set, so read them with rate() or topk().
type Server struct {
	src StatsSource
	hot int
	d   serverDescs

	mu   sync.Mutex // serialises collections, which compare with prev
	prev map[int]uint64
}

type serverDescs struct {
	requests, rows, bytes, latency, refused *prometheus.Desc
	tableRows, tableMemory, owned, version  *prometheus.Desc
	hotRows, hotRequests, hotBusy           *prometheus.Desc
}

var _ prometheus.Collector = (*Server)(nil)

// NewServer returns the metrics of the parameter server src (*ps.Server). cfg.Role defaults to
// "server" and cfg.Node to the server's ID.
func NewServer(src StatsSource, cfg Config) (*Server, error) {
	node := ""
	if s, ok := src.(*ps.Server); ok && s != nil {
		node = s.ID()
	}
	cfg = cfg.withDefaults(elastic.RoleServer.String(), node)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if src == nil {
		return nil, ErrNilSource
	}
	hot := cfg.HotSlots
	if hot == 0 {
		hot = 8
	}
	return &Server{src: src, hot: max(hot, 0), d: serverDescs{
		requests:    cfg.desc("server_requests_total", "Pull and push requests served, by table.", "op", "table"),
		rows:        cfg.desc("server_rows_total", "Rows pulled (sent) and pushed (received), by table.", "op", "table"),
		bytes:       cfg.desc("server_bytes_total", "Payload bytes of the rows pulled and pushed, by table.", "op", "table"),
		latency:     cfg.desc("server_request_duration_seconds", "Serving time of pull and push requests.", "op"),
		refused:     cfg.desc("server_refused_requests_total", "Requests refused: wrong_owner (another server's slot), moved (a slot being handed over), fenced (a fenced worker epoch).", "reason"),
		tableRows:   cfg.desc("server_table_rows", "Rows a table holds on the server.", "table"),
		tableMemory: cfg.desc("server_table_memory_bytes", "Memory a table's rows and optimizer state hold on the server.", "table"),
		owned:       cfg.desc("server_owned_slots", "Slots the server owns."),
		version:     cfg.desc("server_owner_table_version", "Version of the owner table the server serves."),
		hotRows:     cfg.desc("server_hot_slot_rows_total", "Rows pulled or pushed, of each of the server's hottest slots.", "slot"),
		hotRequests: cfg.desc("server_hot_slot_requests_total", "Requests touching each of the server's hottest slots.", "slot"),
		hotBusy:     cfg.desc("server_hot_slot_busy_seconds_total", "Serving time of each of the server's hottest slots (a request's time split over its slots by rows).", "slot"),
	}}, nil
}

// Describe implements prometheus.Collector.
func (s *Server) Describe(ch chan<- *prometheus.Desc) {
	d := &s.d
	for _, x := range []*prometheus.Desc{d.requests, d.rows, d.bytes, d.latency, d.refused, d.tableRows, d.tableMemory, d.owned, d.version, d.hotRows, d.hotRequests, d.hotBusy} {
		ch <- x
	}
}

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	st := s.src.Stats(false)
	d := &s.d
	counter := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	for _, t := range st.Tables {
		counter(d.requests, t.Pulls, OpPull, t.Name)
		counter(d.requests, t.Pushes, OpPush, t.Name)
		counter(d.rows, t.RowsOut, OpPull, t.Name)
		counter(d.rows, t.RowsIn, OpPush, t.Name)
		counter(d.bytes, t.BytesOut, OpPull, t.Name)
		counter(d.bytes, t.BytesIn, OpPush, t.Name)
		gauge(d.tableRows, float64(t.Rows), t.Name)
		gauge(d.tableMemory, float64(t.MemoryBytes), t.Name)
	}
	ch <- constHistogram(d.latency, st.PullLatency, OpPull)
	ch <- constHistogram(d.latency, st.PushLatency, OpPush)
	counter(d.refused, st.RefusedWrongOwner, ReasonWrongOwner)
	counter(d.refused, st.RefusedMoved, ReasonMoved)
	counter(d.refused, st.RefusedFenced, ReasonFenced)
	owned := 0
	for _, sl := range st.Slots {
		if sl.Owned {
			owned++
		}
	}
	gauge(d.owned, float64(owned))
	gauge(d.version, float64(st.Version))
	for _, sl := range s.hottest(st.Slots) {
		label := strconv.Itoa(sl.Slot)
		counter(d.hotRows, sl.Accesses, label)
		counter(d.hotRequests, sl.Requests, label)
		ch <- prometheus.MustNewConstMetric(d.hotBusy, prometheus.CounterValue, (time.Duration(sl.BusyNanos)).Seconds(), label)
	}
}

// hottest returns the slots with the most rows served since the previous call, at most s.hot
// of them, busiest first, and remembers slots' counts for the next call.
func (s *Server) hottest(slots []ps.SlotStats) []ps.SlotStats {
	if s.hot == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	type ranked struct {
		ps.SlotStats
		delta uint64
	}
	var rs []ranked
	next := make(map[int]uint64, len(slots))
	for _, sl := range slots {
		if sl.Accesses == 0 {
			continue
		}
		next[sl.Slot] = sl.Accesses
		prev := s.prev[sl.Slot]
		if sl.Accesses < prev {
			prev = 0 // a new incarnation of the server started again from zero
		}
		if delta := sl.Accesses - prev; delta > 0 {
			rs = append(rs, ranked{sl, delta})
		}
	}
	s.prev = next
	slices.SortFunc(rs, func(a, b ranked) int {
		if c := cmp.Compare(b.delta, a.delta); c != 0 {
			return c
		}
		return cmp.Compare(a.Slot, b.Slot)
	})
	out := make([]ps.SlotStats, 0, min(len(rs), s.hot))
	for _, r := range rs[:min(len(rs), s.hot)] {
		out = append(out, r.SlotStats)
	}
	return out
}

// constHistogram turns a ps.Histogram (per-bucket counts) into a Prometheus one (cumulative).
func constHistogram(desc *prometheus.Desc, h ps.Histogram, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.Bounds))
	var cum uint64
	for i, b := range h.Bounds {
		if i < len(h.Counts) {
			cum += h.Counts[i]
		}
		buckets[b] = cum
	}
	return prometheus.MustNewConstHistogram(desc, h.Count, h.Sum, buckets, labels...)
}
