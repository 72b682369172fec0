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
func (st *slotStats) record(sc *reqScratch, rows int, d time.Duration, push bool) {
	if push {
		st.pushes.Add(1)
		st.rowsIn.Add(uint64(rows))
	} else {
		st.pulls.Add(1)
		st.rowsOut.Add(uint64(rows))
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
	// Pulls and Pushes count requests; RowsOut and RowsIn the rows they carried.
	Pulls, Pushes, RowsOut, RowsIn uint64
	Tables                         []TableStats
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
	rows := make([]int, s.cfg.Slots)
	bytes := make([]int64, s.cfg.Slots)
	for _, h := range hs {
		out.Tables = append(out.Tables, TableStats{Name: h.name, Dense: h.dense, Dim: h.t.Dim(), Rows: h.t.Len(), MemoryBytes: h.t.MemoryBytes()})
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
