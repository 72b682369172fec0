package ps

import (
	"context"
	"encoding/json"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/procstat"
	"github.com/elasticps/elasticps/internal/rpc"
)

// slotStats counts, per slot, the rows served and the time spent serving them, so hot slots and
// hot servers can be found. A request counts its rows per slot in its scratch, then adds them
// under one lock into one of a few shards with plain adds, instead of three atomic adds per
// slot it touched; concurrent requests take different shards. A report sums the shards.
type slotStats struct {
	shards  []statShard
	next    atomic.Uint32 // picks the shard a request tries first
	pulls   atomic.Uint64
	pushes  atomic.Uint64
	rowsIn  atomic.Uint64
	rowsOut atomic.Uint64

	// Requests refused, by reason.
	wrongOwner, moved, fenced atomic.Uint64
	pullLatency, pushLatency  latency
}

// tableCounters counts one table's requests and what they carried (dense tensors included).
type tableCounters struct {
	pulls, pushes, rowsOut, rowsIn, bytesOut, bytesIn atomic.Uint64
}

func (c *tableCounters) add(rows, bytes int, push bool) {
	if push {
		c.pushes.Add(1)
		c.rowsIn.Add(uint64(rows))
		c.bytesIn.Add(uint64(bytes))
		return
	}
	c.pulls.Add(1)
	c.rowsOut.Add(uint64(rows))
	c.bytesOut.Add(uint64(bytes))
}

// latencyBounds are the upper bounds of the serving-time buckets, from 25µs to 2.5s.
var latencyBounds = [...]time.Duration{
	25 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond,
	500 * time.Microsecond, time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2500 * time.Millisecond,
}

// latency counts serving times in the buckets of latencyBounds (one more above them).
type latency struct {
	counts [len(latencyBounds) + 1]atomic.Uint64
	sum    atomic.Uint64 // nanoseconds
}

func (l *latency) observe(d time.Duration) {
	i := 0
	for i < len(latencyBounds) && d > latencyBounds[i] {
		i++
	}
	l.counts[i].Add(1)
	l.sum.Add(uint64(max(d, 0)))
}

func (l *latency) histogram() Histogram {
	h := Histogram{Bounds: make([]float64, len(latencyBounds)), Counts: make([]uint64, len(l.counts))}
	for i, b := range latencyBounds {
		h.Bounds[i] = b.Seconds()
	}
	for i := range l.counts {
		h.Counts[i] = l.counts[i].Load()
		h.Count += h.Counts[i]
	}
	h.Sum = time.Duration(l.sum.Load()).Seconds()
	return h
}

// Histogram is a distribution of serving times.
type Histogram struct {
	// Bounds are the buckets' upper bounds in seconds, ascending; one more bucket holds what
	// is above the last.
	Bounds []float64
	// Counts has len(Bounds)+1 counts, each of its own bucket only (not cumulative).
	Counts []uint64
	// Count is the number of requests, Sum their serving time in seconds.
	Count uint64
	Sum   float64
}

// ProcessStats is what a server's process uses. Several servers in one process (an in-process
// job) report the same process: the same Pid and Host.
type ProcessStats struct {
	Pid  int
	Host string
	// CPU is the user and system time the process has used since it started.
	CPU time.Duration
	// ResidentBytes is the memory it holds in RAM (zero where the system does not say). It
	// counts shared pages (the flash checkpoint's shared memory) too.
	ResidentBytes int64
	// CgroupBytes is the memory its memory cgroup is charged, less the inactive file pages:
	// what the kernel kills the process for when it goes over CgroupLimitBytes, the cgroup's
	// limit. Both are zero when the process is in no memory cgroup with a limit. A server that
	// does not fill them (an older one) reports none.
	CgroupBytes, CgroupLimitBytes int64
}

// statShard is one set of per-slot counters, padded so that shards do not share a cache line.
type statShard struct {
	mu    sync.Mutex
	slots []slotCount
	_     [32]byte
}

// slotCount is one slot's counters in one shard.
type slotCount struct {
	accesses uint64 // rows pulled or pushed
	requests uint64 // requests touching the slot
	busy     uint64 // nanoseconds of serving, split over slots by rows
}

// maxStatShards bounds the shards; each holds 24 bytes per slot.
const maxStatShards = 16

func (st *slotStats) init(slots int) {
	n := 1
	for n < runtime.GOMAXPROCS(0) && n < maxStatShards {
		n <<= 1
	}
	st.shards = make([]statShard, n)
	for i := range st.shards {
		st.shards[i].slots = make([]slotCount, slots)
	}
}

// record adds one request's per-slot counts (in sc, which it clears).
func (st *slotStats) record(h *hosted, sc *reqScratch, rows int, d time.Duration, push bool) {
	bytes := rows * 4 * h.t.Dim()
	h.counts.add(rows, bytes, push)
	if push {
		st.pushes.Add(1)
		st.rowsIn.Add(uint64(rows))
		st.pushLatency.observe(d)
	} else {
		st.pulls.Add(1)
		st.rowsOut.Add(uint64(rows))
		st.pullLatency.observe(d)
	}
	per := uint64(0)
	if rows > 0 {
		per = uint64(d.Nanoseconds()) / uint64(rows)
	}
	sh := st.lock()
	counts := sh.slots
	for _, s := range sc.slots {
		c := uint64(sc.count[s])
		sc.count[s] = 0
		sl := &counts[s]
		sl.accesses += c
		sl.requests++
		sl.busy += c * per
	}
	sh.mu.Unlock()
	sc.slots = sc.slots[:0]
}

// denseDone counts a dense tensor's pull or push of rows rows, begun at start.
func (st *slotStats) denseDone(h *hosted, rows int, start time.Time, push bool) {
	h.counts.add(rows, 4*h.length, push)
	if push {
		st.pushLatency.observe(time.Since(start))
	} else {
		st.pullLatency.observe(time.Since(start))
	}
}

// lock locks and returns a shard: the first free one from a rotating start, else waits for the
// start.
func (st *slotStats) lock() *statShard {
	mask := uint32(len(st.shards) - 1)
	start := st.next.Add(1) & mask
	for i := uint32(0); i <= mask; i++ {
		if sh := &st.shards[(start+i)&mask]; sh.mu.TryLock() {
			return sh
		}
	}
	sh := &st.shards[start]
	sh.mu.Lock()
	return sh
}

// load returns every slot's counters summed over the shards.
func (st *slotStats) load() []slotCount {
	out := make([]slotCount, len(st.shards[0].slots))
	for i := range st.shards {
		sh := &st.shards[i]
		sh.mu.Lock()
		for s, c := range sh.slots {
			o := &out[s]
			o.accesses += c.accesses
			o.requests += c.requests
			o.busy += c.busy
		}
		sh.mu.Unlock()
	}
	return out
}

// ServerStats is a server's report. Counters are totals since the server started; two reports
// give rates.
type ServerStats struct {
	ID      string
	Version uint64 // owner-table version
	Uptime  time.Duration
	// Pulls and Pushes count requests for rows of sparse tables; RowsOut and RowsIn the rows
	// they carried.
	Pulls, Pushes, RowsOut, RowsIn uint64
	// RefusedWrongOwner counts requests refused for a slot the server does not own,
	// RefusedMoved for a slot it is handing over, RefusedFenced pushes of a fenced epoch.
	RefusedWrongOwner, RefusedMoved, RefusedFenced uint64
	// PullLatency and PushLatency are the serving times of pull and push requests, dense
	// tensors' included (a synchronous push's includes its wait for the step to complete).
	PullLatency, PushLatency Histogram
	// Process is what the server's process uses.
	Process ProcessStats
	Tables  []TableStats
	// Slots lists every owned slot and every slot with activity or rows.
	Slots []SlotStats
}

// TableStats describes one hosted table.
type TableStats struct {
	Name        string
	Dense       bool
	Dim         int
	Rows        int
	MemoryBytes int64
	// Pulls and Pushes count the requests for the table, RowsOut and RowsIn the rows they
	// carried, BytesOut and BytesIn the bytes of those rows (4 per value).
	Pulls, Pushes, RowsOut, RowsIn, BytesOut, BytesIn uint64
}

// SlotStats describes one slot on one server.
type SlotStats struct {
	Slot  int
	Owned bool
	// Rows and Bytes held (over all tables); filled only when asked for, since counting them
	// visits every row.
	Rows  int
	Bytes int64
	// Accesses counts rows pulled or pushed, Requests the requests that touched the slot.
	Accesses, Requests uint64
	// BusyNanos is the time spent serving the slot's rows: the request's serving time split
	// over its slots by rows. Serving is in-memory work, so this is close to CPU time.
	BusyNanos uint64
}

// Stats returns the server's report; withRows also counts rows and bytes per slot.
func (s *Server) Stats(withRows bool) ServerStats {
	s.own.RLock()
	out := ServerStats{ID: s.cfg.ID, Version: s.version(), Uptime: time.Since(s.started)}
	owned := s.own.slots
	hs := make([]*hosted, 0, len(s.own.tables))
	for _, h := range s.own.tables {
		hs = append(hs, h)
	}
	s.own.RUnlock()
	sort.Slice(hs, func(i, j int) bool { return hs[i].name < hs[j].name })
	st := &s.stats
	out.Pulls, out.Pushes, out.RowsOut, out.RowsIn = st.pulls.Load(), st.pushes.Load(), st.rowsOut.Load(), st.rowsIn.Load()
	out.RefusedWrongOwner, out.RefusedMoved, out.RefusedFenced = st.wrongOwner.Load(), st.moved.Load(), st.fenced.Load()
	out.PullLatency, out.PushLatency = st.pullLatency.histogram(), st.pushLatency.histogram()
	p := procstat.Read()
	out.Process = ProcessStats{Pid: p.Pid, Host: p.Host, CPU: p.CPU, ResidentBytes: p.ResidentBytes,
		CgroupBytes: p.CgroupBytes, CgroupLimitBytes: p.CgroupLimitBytes}
	rows := make([]int, s.cfg.Slots)
	bytes := make([]int64, s.cfg.Slots)
	for _, h := range hs {
		c := &h.counts
		out.Tables = append(out.Tables, TableStats{Name: h.name, Dense: h.dense, Dim: h.t.Dim(), Rows: h.t.Len(), MemoryBytes: h.t.MemoryBytes(),
			Pulls: c.pulls.Load(), Pushes: c.pushes.Load(), RowsOut: c.rowsOut.Load(), RowsIn: c.rowsIn.Load(), BytesOut: c.bytesOut.Load(), BytesIn: c.bytesIn.Load()})
		if !withRows {
			continue
		}
		if h.dense {
			rows[h.slot] += h.t.Len()
			bytes[h.slot] += int64(h.t.Len() * h.t.PayloadBytesPerRow())
			continue
		}
		per := int64(h.t.PayloadBytesPerRow())
		h.t.Range(func(v embedding.RowView) bool {
			sl := embedding.Slot(v.ID, s.cfg.Slots)
			rows[sl]++
			bytes[sl] += per
			return true
		})
	}
	counts := st.load()
	for sl := 0; sl < s.cfg.Slots; sl++ {
		a, r, b := counts[sl].accesses, counts[sl].requests, counts[sl].busy
		if !owned.Has(sl) && a == 0 && rows[sl] == 0 {
			continue
		}
		out.Slots = append(out.Slots, SlotStats{Slot: sl, Owned: owned.Has(sl), Rows: rows[sl], Bytes: bytes[sl], Accesses: a, Requests: r, BusyNanos: b})
	}
	return out
}

// handleStats answers a Stats request; the request is one byte, 1 to count rows per slot.
func (s *Server) handleStats(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	st := s.Stats(len(req) == 1 && req[0] == 1)
	return json.NewEncoder(resp).Encode(st)
}

// SlotRate is a slot's load between two reports.
type SlotRate struct {
	Slot int
	// AccessesPerSec and RequestsPerSec are rows and requests served per second.
	AccessesPerSec, RequestsPerSec float64
	// Busy is the fraction of one core spent serving the slot.
	Busy float64
}

// Since returns each slot's load between prev and s, two reports of the same server, busiest
// first. Slots without activity in between are left out.
func (s ServerStats) Since(prev ServerStats) []SlotRate {
	secs := (s.Uptime - prev.Uptime).Seconds()
	if secs <= 0 {
		return nil
	}
	before := make(map[int]SlotStats, len(prev.Slots))
	for _, p := range prev.Slots {
		before[p.Slot] = p
	}
	var out []SlotRate
	for _, c := range s.Slots {
		p := before[c.Slot]
		if c.Accesses == p.Accesses && c.Requests == p.Requests {
			continue
		}
		out = append(out, SlotRate{
			Slot:           c.Slot,
			AccessesPerSec: float64(c.Accesses-p.Accesses) / secs,
			RequestsPerSec: float64(c.Requests-p.Requests) / secs,
			Busy:           float64(c.BusyNanos-p.BusyNanos) / 1e9 / secs,
		})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Busy != out[j].Busy {
			return out[i].Busy > out[j].Busy
		}
		return out[i].Slot < out[j].Slot
	})
	return out
}
