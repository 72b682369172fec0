package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
)

// runRepartition measures a live scale-out from 2 to 3 parameter servers while 4 workers pull
// and push continuously over loopback TCP (batches of distinct ids drawn Zipf(1.1) by rank, as
// in the ps suite), against the same change made the DLRover way in the
// same run (checkpoint, stop everything, start 3 servers, restore, train). It reports:
//
//   - moved_rows_fraction: rows copied by the base copies over the rows of the job (ideal 1/3);
//   - migration_s: from the start of the move to the last owner table published;
//   - throughput_during_vs_before: training rows/s during the move over rows/s before it;
//   - max_request_stall_ms: the longest single pull or push that overlapped the move (and
//     max_request_ms_before, the same for as long a time before, for scale);
//   - migrate_vs_pull: rows/s moved over the rows/s the same workers pull from the servers;
//   - stop_restart_s and stop_restart_vs_live: the DLRover way, to every worker's first batch
//     on the new layout, and its time over the live move's;
//   - scale-in back to 2 servers, live, as scale_in_s;
//   - the same scale-out with the migrations' bandwidth capped at the bytes of half the pull
//     rate, as capped_*;
//   - the least a moved row costs here (see moveFloor), alone and while training runs, as
//     move_floor_* and floor_*.
//
// The live figures come from several rounds of scale-out and scale-in, each ratio against the
// windows of its own round (median and range).
func runRepartition(ctx context.Context, opt options, r *report) error {
	rp := repParams{perServer: 4 << 20, batch: 1024, workers: 4, phase: 4 * time.Second, rounds: 3}
	if opt.quick {
		rp = repParams{perServer: 1 << 15, batch: 256, workers: 4, phase: 300 * time.Millisecond, rounds: 1}
	}
	dir, err := os.MkdirTemp(opt.dir, "bench-repartition-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	shm, release, err := shmScratch(shmRoot, "bench-repartition-", dir)
	if err != nil {
		return err
	}
	defer release()
	rp.dir, rp.shm = dir, shm
	rp.secret = make([]byte, 32)
	rand.Read(rp.secret)

	// The floor's slabs: each stream reads a third of 3*perStream records, as a source whose
	// moving slots hold a third of its rows does.
	floorRows := min(rp.perServer/8, 1<<19)
	fl, err := newMoveFloor(rp.secret, repRowBytes, floorRows)
	if err != nil {
		return err
	}
	defer fl.close() // idempotent: closed once the rounds are done
	job, err := rp.start(ctx, []string{"ps-0", "ps-1"})
	if err != nil {
		return err
	}
	defer job.close()
	fmt.Printf("repartition: filling %d rows of dim %d (Adagrad, %d B per row) on 2 servers...\n", 2*rp.perServer, repDim, repRowBytes)
	if err := job.fill(rp.perServer * 2); err != nil {
		return err
	}
	ws, err := job.startWorkers(ctx, rp.workers, rp.batch, rp.perServer*2)
	if err != nil {
		return err
	}
	m, err := ps.NewMigrator(ps.MigratorConfig{Secret: rp.secret})
	if err != nil {
		return err
	}
	defer m.Close()
	if err := job.add("ps-2"); err != nil {
		return err
	}
	// Rounds of: the pull rate, training before the move, the live scale-out, training on 3
	// servers, the live scale-in. Each round's ratios use its own windows, so a slow spell of
	// this shared machine spoils one round, not the figure; the first round's target server is
	// new (its rows are allocated as they arrive), the later ones reuse what it freed.
	rs, err := rp.runRounds(ctx, "round", job, ws, fl, m, nil)
	if err != nil {
		return err
	}
	fl.close() // and its slabs given back: the DLRover way below needs the memory
	debug.FreeOSMemory()
	first := rs.rounds[0]
	r.add("moved_rows_fraction", float64(first.prog.BaseRows)/float64(2*rp.perServer), "rows copied by the base copies over the job's rows (ideal 1/3 for 2 -> 3 servers)")
	r.add("migration_s", rs.median(func(o repRound) float64 { return o.migS }), fmt.Sprintf("s to move %d of %d slots, %d groups, live (median of %d rounds; first round %.2f s)", first.prog.SlotsDone, ps.DefaultSlots, first.prog.Groups, len(rs.rounds), first.migS))
	r.addRatio("throughput_during_vs_before", rs.spread(func(o repRound) float64 { return o.during }, func(o repRound) float64 { return o.before }),
		"training rows/s on 2 servers just before the move", "", "training rows/s during the move over just before it")
	r.addRatio("throughput_after_vs_before", rs.spread(func(o repRound) float64 { return o.after }, func(o repRound) float64 { return o.before }),
		"training rows/s on 2 servers just before the move", "", "training rows/s on 3 servers over on 2")
	r.add("max_request_stall_ms", ms2(rs.max(func(o repRound) time.Duration { return o.stall })), "ms, the longest single pull or push that overlapped a move, over all rounds")
	r.add("max_request_ms_before", ms2(rs.max(func(o repRound) time.Duration { return o.maxBefore })), "ms, the same for as long a time before each move")
	r.add("max_fenced_ms", ms2(rs.max(func(o repRound) time.Duration { return o.prog.MaxFenced })), "ms, the longest a group's slots were fenced before their table went out")
	r.add("pull_rows_per_s", rs.median(func(o repRound) float64 { return o.pull }), "rows/s the same workers pull from the servers (the PS pull rate, median of the rounds)")
	r.addRatio("migrate_vs_pull", rs.spread(func(o repRound) float64 { return o.moveRate }, func(o repRound) float64 { return o.pull }),
		"rows/s the same workers pull from the servers in the same round", "pull_rows_per_s", fmt.Sprintf("rows/s moved (with optimizer state: %d B per row) over the pull rate", repRowBytes))
	r.add("migrated_bytes_per_s", rs.median(func(o repRound) float64 { return float64(o.prog.Bytes) / o.migS }), "bytes/s copied, catch-up rounds included")
	r.add("pull_cpu_us_per_row", 1e6*rs.median(func(o repRound) float64 { return o.pullCPU }), "us of CPU (this process: workers and servers) per row pulled, pulls only")
	r.add("train_cpu_us_per_row", 1e6*rs.median(func(o repRound) float64 { return o.trainCPU }), "us of CPU per row trained (pulled and pushed) before the move")
	r.add("move_cpu_us_per_row", 1e6*rs.median(func(o repRound) float64 { return o.moveCPU }), "us of CPU per row moved: the move's window less its training at the cost before it")
	r.addRatio("move_cpu_vs_pull_cpu", rs.spread(func(o repRound) float64 { return o.moveCPU }, func(o repRound) float64 { return o.pullCPU }),
		"us of CPU per row pulled in the same round", "pull_cpu_us_per_row", fmt.Sprintf("CPU per row moved (%d B with its optimizer state) over CPU per row pulled (%d B)", repRowBytes, repPullBytes))
	r.add("throughput_bound_at_half_pull", rs.median(func(o repRound) float64 { return o.boundAtHalfPull() }),
		"the most throughput_during_vs_before these costs allow while rows move at half the pull rate (1 - pull/2 * move CPU / cores training used)")
	r.add("move_floor_cpu_us_per_row", 1e6*rs.median(func(o repRound) float64 { return o.floorCPU }),
		"us of CPU per row moved with no table work: every third record of a cold slab read, sent in 4 MiB chunks with an AES-GCM tag over loopback TCP, checked and copied into a cold slab (2 streams, a connection each)")
	r.addRatio("move_floor_vs_pull_cpu", rs.spread(func(o repRound) float64 { return o.floorCPU }, func(o repRound) float64 { return o.pullCPU }),
		"us of CPU per row pulled in the same round", "pull_cpu_us_per_row", "the floor's CPU per row over a pulled row's")
	r.addRatio("move_cpu_vs_floor", rs.spread(func(o repRound) float64 { return o.moveCPU }, func(o repRound) float64 { return o.floorCPU }),
		"the floor's CPU per row in the same round", "move_floor_cpu_us_per_row", "CPU per row moved over the floor's: what the tables' work adds")
	r.add("throughput_bound_at_floor", rs.median(func(o repRound) float64 { return 1 - o.pull/2*o.floorCPU/o.cores }),
		"the most throughput_during_vs_before a move that costs the floor allows while rows move at half the pull rate")
	r.addRatio("floor_throughput_during_vs_before", rs.spread(func(o repRound) float64 { return o.floorDuring }, func(o repRound) float64 { return o.before }),
		"training rows/s on 2 servers just before the move", "", "training rows/s while the floor moves rows at half the pull rate, over before")
	r.addRatio("floor_migrate_vs_pull", rs.spread(func(o repRound) float64 { return o.floorRate }, func(o repRound) float64 { return o.pull }),
		"rows/s the same workers pull from the servers in the same round", "pull_rows_per_s", "rows/s the floor moved while training ran (paced to half the pull rate) over the pull rate")
	r.add("floor_cpu_us_per_row_training", 1e6*rs.median(func(o repRound) float64 { return o.floorTrainCPU }),
		"us of CPU per row the floor moved while training ran: its window less its training at the cost before it")
	r.add("scale_in_s", rs.median(func(o repRound) float64 { return o.scaleInS }), "s to drain ps-2 back onto 2 servers, live")
	migS := r.get("migration_s")

	// The same scale-out with each migration's copying capped at the bytes of half the pull
	// rate, the rate of the migrate_vs_pull target: the training throughput the move leaves at
	// about that rate, for comparison with the floor's. Two migrations run at once, one per
	// source.
	capBW := max(int64(capOfPull*r.get("pull_rows_per_s")*float64(repRowBytes)/2), 1<<20)
	mc, err := ps.NewMigrator(ps.MigratorConfig{Secret: rp.secret, Bandwidth: capBW})
	if err != nil {
		return err
	}
	defer mc.Close()
	cs, err := rp.runRounds(ctx, "capped round", job, ws, nil, m, mc)
	if err != nil {
		return err
	}
	r.add("capped_migration_s", cs.median(func(o repRound) float64 { return o.migS }), fmt.Sprintf("s for the same scale-out with every migration capped at %.0f MiB/s (median of %d rounds)", float64(capBW)/(1<<20), len(cs.rounds)))
	r.addRatio("capped_throughput_during_vs_before", cs.spread(func(o repRound) float64 { return o.during }, func(o repRound) float64 { return o.before }),
		"training rows/s on 2 servers just before the move", "", "training rows/s during the capped move over just before it")
	r.add("capped_max_request_stall_ms", ms2(cs.max(func(o repRound) time.Duration { return o.stall })), "ms, the longest single pull or push that overlapped a capped move")
	r.addRatio("capped_migrate_vs_pull", cs.spread(func(o repRound) float64 { return o.moveRate }, func(o repRound) float64 { return o.pull }),
		"rows/s the same workers pull from the servers in the same round", "pull_rows_per_s", "rows/s moved by the capped move over the pull rate")
	if err := ws.stop(); err != nil {
		return err
	}
	if err := job.drop("ps-2"); err != nil {
		return err
	}

	// The DLRover way: checkpoint, stop everything, start 3 servers, restore, train.
	stop, err := rp.stopRestart(ctx, job)
	if err != nil {
		return fmt.Errorf("stop and restart: %w", err)
	}
	r.add("stop_restart_s", stop.Seconds(), "s: checkpoint to storage, stop every server and worker, start 3 servers, restore from storage, every worker's first batch (in process: no process start-up counted)")
	r.add("stop_restart_vs_live", stop.Seconds()/migS, "stop-and-restart time over the live move's (training went on during the live move)")
	return nil
}

const repDim = 64

// repRowBytes is a moved row's size (id, step and frequency, weights, Adagrad state);
// repPullBytes, a pulled row's (id and weights).
const (
	repRowBytes  = 16 + 2*4*repDim
	repPullBytes = 8 + 4*repDim
)

// capOfPull is the capped move's bandwidth, both migrations together, as a fraction of the pull
// rate's bytes (a moved row's bytes at the pull rate). The move's rows go slower: the cap counts
// the catch-up rounds' bytes too, and the move's time its fences and publications.
const capOfPull = 0.5

// repRound is what one round of scale-out and scale-in measured.
type repRound struct {
	pull, before, during, after, moveRate float64 // rows/s
	stall, maxBefore                      time.Duration
	migS, scaleInS                        float64
	prog                                  ps.MigrationProgress
	// CPU seconds per row pulled (pulls only), trained (pull and push), moved (the move's
	// window less its training) and moved by the floor (see moveFloor), and the cores busy
	// training before the move.
	pullCPU, trainCPU, moveCPU, floorCPU, cores float64
	// The floor under training at half the pull rate: rows/s it moved, training rows/s
	// meanwhile, and its CPU per row less that training's.
	floorRate, floorDuring, floorTrainCPU float64
}

// boundAtHalfPull is the most training rows/s over those before a move that this round's costs
// allow while rows move at half the pull rate: moving them takes pull/2 * moveCPU of the cores
// training had.
func (o repRound) boundAtHalfPull() float64 { return 1 - o.pull/2*o.moveCPU/o.cores }

// round measures the pull rate, the floor's cost of a moved row (unless fl is nil), training
// before a move, the live scale-out from ps-0 and ps-1 to all three servers (by out, or by m),
// training after it, and the scale-in back with m.
func (p repParams) round(ctx context.Context, job *repJob, ws *repWorkers, fl *moveFloor, m, out *ps.Migrator) (repRound, error) {
	if out == nil {
		out = m
	}
	var o repRound
	var cpuErr error
	cpuNow := func() (procCPU, time.Time) { // this process's CPU time and the wall clock
		c, err := selfCPU()
		cpuErr = cmp.Or(cpuErr, err)
		return c, time.Now()
	}
	ws.set(repPull)
	sleepCtx(ctx, p.phase/8) // let the push traffic drain
	c0, t0 := cpuNow()
	sleepCtx(ctx, p.phase/2)
	c1, t1 := cpuNow()
	o.pull = ws.rate(t0, t1)
	o.pullCPU = c1.sub(c0).total().Seconds() / (o.pull * t1.Sub(t0).Seconds())
	if fl != nil {
		ws.set(repIdle)
		sleepCtx(ctx, p.phase/8) // let the last pulls end
		c0, _ := cpuNow()
		n, err := fl.run(ctx, 0)
		c1, _ := cpuNow()
		if err != nil {
			return o, fmt.Errorf("move floor: %w", err)
		}
		o.floorCPU = c1.sub(c0).total().Seconds() / float64(n)
	}
	ws.set(repTrain)
	sleepCtx(ctx, p.phase/4) // let the push traffic settle
	c1, t1 = cpuNow()
	sleepCtx(ctx, p.phase)
	c2, t2 := cpuNow()
	o.before, o.maxBefore = ws.rate(t1, t2), ws.maxLatency(t1, t2)
	o.cores = c2.sub(c1).total().Seconds() / t2.Sub(t1).Seconds()
	o.trainCPU = o.cores / o.before
	if fl != nil {
		// The floor again, while training runs, moving rows at half the pull rate: the
		// throughput a move with no table work leaves training at the rate of the target.
		c0, t0 := cpuNow()
		n, err := fl.run(ctx, o.pull/2)
		c1, t1 := cpuNow()
		if err != nil {
			return o, fmt.Errorf("move floor: %w", err)
		}
		o.floorRate = float64(n) / t1.Sub(t0).Seconds()
		o.floorDuring = ws.rate(t0, t1)
		o.floorTrainCPU = (c1.sub(c0).total().Seconds() - o.floorDuring*t1.Sub(t0).Seconds()*o.trainCPU) / float64(n)
		sleepCtx(ctx, p.phase/8)
	}

	cur := job.holder.Get()
	next, err := ps.NewOwnerTable(0, cur.Slots, job.nodes(), cur)
	if err != nil {
		return o, err
	}
	cs, ms := cpuNow()
	cur, err = out.Migrate(ctx, cur, next, job.publish)
	ce, me := cpuNow()
	if err != nil {
		return o, fmt.Errorf("scale out: %w", err)
	}
	o.prog = out.Progress()
	o.during, o.stall = ws.rate(ms, me), ws.maxLatency(ms, me)
	o.migS = me.Sub(ms).Seconds()
	o.moveRate = float64(o.prog.BaseRows) / o.migS
	// What the move cost: the CPU of its window less what its training cost at the rate
	// measured before it.
	o.moveCPU = (ce.sub(cs).total().Seconds() - o.during*o.migS*o.trainCPU) / float64(o.prog.BaseRows)
	if cpuErr != nil {
		return o, fmt.Errorf("CPU time: %w", cpuErr)
	}
	sleepCtx(ctx, p.phase/2)
	o.after = ws.rate(me, time.Now())

	two, err := ps.NewOwnerTable(0, cur.Slots, job.nodes("ps-0", "ps-1"), cur)
	if err != nil {
		return o, err
	}
	si := time.Now()
	if _, err := m.Migrate(ctx, cur, two, job.publish); err != nil {
		return o, fmt.Errorf("scale in: %w", err)
	}
	o.scaleInS = time.Since(si).Seconds()
	return o, nil
}

// runRounds runs p.rounds rounds (see round), printing each one's headline figures under label.
func (p repParams) runRounds(ctx context.Context, label string, job *repJob, ws *repWorkers, fl *moveFloor, m, out *ps.Migrator) (repRounds, error) {
	var rs repRounds
	for k := range p.rounds {
		o, err := p.round(ctx, job, ws, fl, m, out)
		if err != nil {
			return rs, fmt.Errorf("%s %d: %w", label, k+1, err)
		}
		rs.add(o)
		fmt.Printf("repartition: %s %d: %.2f s, %.3f of the training rate during the move, %.3f of the pull rate moved\n", label, k+1, o.migS, o.during/o.before, o.moveRate/o.pull)
	}
	return rs, nil
}

// repRounds collects rounds.
type repRounds struct{ rounds []repRound }

func (rs *repRounds) add(o repRound) { rs.rounds = append(rs.rounds, o) }

func (rs *repRounds) median(f func(repRound) float64) float64 {
	var v []float64
	for _, o := range rs.rounds {
		v = append(v, f(o))
	}
	return median(v)
}

func (rs *repRounds) max(f func(repRound) time.Duration) time.Duration {
	var m time.Duration
	for _, o := range rs.rounds {
		m = max(m, f(o))
	}
	return m
}

// spread returns subject over baseline of each round, summarised.
func (rs *repRounds) spread(subject, baseline func(repRound) float64) spread {
	s := samples{}
	for _, o := range rs.rounds {
		s["subject"] = append(s["subject"], subject(o))
		s["baseline"] = append(s["baseline"], baseline(o))
	}
	return s.ratio("subject", "baseline")
}

type repParams struct {
	perServer, batch, workers int
	rounds                    int // of scale-out and scale-in
	phase                     time.Duration
	dir, shm                  string
	secret                    []byte
}

// repJob is a set of servers over loopback TCP and the table they serve.
type repJob struct {
	p      repParams
	mu     sync.Mutex
	srvs   map[string]*ps.Server
	addrs  map[string]string
	holder ps.TableHolder
	wg     sync.WaitGroup
}

func repTableConfig() embedding.Config {
	return embedding.Config{Dim: repDim, Seed: 1, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}
}

func (p repParams) start(ctx context.Context, ids []string) (*repJob, error) {
	j := &repJob{p: p, srvs: map[string]*ps.Server{}, addrs: map[string]string{}}
	for _, id := range ids {
		if err := j.add(id); err != nil {
			j.close()
			return nil, err
		}
	}
	t, err := ps.NewOwnerTable(1, ps.DefaultSlots, j.nodes(), nil)
	if err != nil {
		j.close()
		return nil, err
	}
	return j, j.publish(ctx, t)
}

func (j *repJob) add(id string) error {
	srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: j.p.secret, Tables: []ps.TableSpec{{Name: "emb", Config: repTableConfig()}}})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	j.wg.Add(1)
	go func() { defer j.wg.Done(); srv.Serve(l) }()
	j.mu.Lock()
	j.srvs[id], j.addrs[id] = srv, l.Addr().String()
	j.mu.Unlock()
	return nil
}

// drop stops server id.
func (j *repJob) drop(id string) error {
	j.mu.Lock()
	s := j.srvs[id]
	delete(j.srvs, id)
	delete(j.addrs, id)
	j.mu.Unlock()
	if s == nil {
		return fmt.Errorf("no server %s", id)
	}
	return s.Close()
}

// nodes returns the nodes of the given servers (none given: all of them).
func (j *repJob) nodes(ids ...string) []ps.Node {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(ids) == 0 {
		for id := range j.srvs {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	var out []ps.Node
	for _, id := range ids {
		out = append(out, ps.Node{ID: id, Addr: j.addrs[id]})
	}
	return out
}

// publish installs t on every running server, then gives it to clients.
func (j *repJob) publish(ctx context.Context, t *ps.OwnerTable) error {
	j.mu.Lock()
	srvs := make([]*ps.Server, 0, len(j.srvs))
	for _, s := range j.srvs {
		srvs = append(srvs, s)
	}
	j.mu.Unlock()
	for _, s := range srvs {
		if _, err := s.SetOwnerTable(t); err != nil {
			return err
		}
	}
	j.holder.Set(t)
	return nil
}

func (j *repJob) close() {
	j.mu.Lock()
	for _, s := range j.srvs {
		s.Close()
	}
	j.srvs = map[string]*ps.Server{}
	j.mu.Unlock()
	j.wg.Wait()
}

// fill creates rows ids 0..n-1 (as rankID) on their owners, in parallel.
func (j *repJob) fill(n int) error {
	t := j.holder.Get()
	j.mu.Lock()
	tabs := map[string]*embedding.Table{}
	for id, s := range j.srvs {
		tabs[id], _ = s.Table("emb")
	}
	j.mu.Unlock()
	const chunk = 1 << 14
	var wg sync.WaitGroup
	errs := make(chan error, runtime.GOMAXPROCS(0))
	next := make(chan int)
	for range cap(errs) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			byOwner := map[string][]uint64{}
			buf := make([]float32, chunk*repDim)
			for base := range next {
				clear(byOwner)
				for i := base; i < min(base+chunk, n); i++ {
					id := rankID(uint64(i))
					o := t.Owner(embedding.Slot(id, t.Slots)).ID
					byOwner[o] = append(byOwner[o], id)
				}
				for o, ids := range byOwner {
					if err := tabs[o].Lookup(ids, buf[:len(ids)*repDim]); err != nil {
						select {
						case errs <- err:
						default:
						}
						return
					}
				}
			}
		}()
	}
	for base := 0; base < n; base += chunk {
		next <- base
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// What the bench workers do.
const (
	repPull  = iota // pull only
	repTrain        // pull, then push gradients
	repIdle         // wait
)

// repWorkers are the workers' goroutines and their timed requests.
type repWorkers struct {
	mode   chan int // closed to stop
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	events []repEvent
	err    error
	modeMu sync.Mutex
	cur    int
	resume chan struct{} // closed when the workers stop being idle
	ready  atomic.Int64  // workers that have pushed at least once
}

// repEvent is one request.
type repEvent struct {
	start, end time.Time
	rows       int
	push       bool
}

func (j *repJob) startWorkers(ctx context.Context, n, batch, rows int) (*repWorkers, error) {
	ctx, cancel := context.WithCancel(ctx)
	ws := &repWorkers{cancel: cancel, mode: make(chan int)}
	for w := range n {
		cl, err := ps.NewClient(ps.ClientConfig{Secret: j.p.secret, Resolver: &j.holder})
		if err != nil {
			cancel()
			return nil, err
		}
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
			defer cl.Close()
			rng := mrand.New(mrand.NewPCG(uint64(w), 77))
			// Ids by rank, Zipf(1.1) as in the ps suite: some rows are hot, as in real traffic.
			zipf := mrand.NewZipf(rng, 1.1, 1, uint64(rows-1))
			ids := make([]uint64, batch)
			vals := make([]float32, batch*repDim)
			grads := make([]float32, batch*repDim)
			for i := range grads {
				grads[i] = float32(rng.NormFloat64()) * 1e-3
			}
			var local []repEvent
			pushed := false
			flush := func() {
				ws.mu.Lock()
				ws.events = append(ws.events, local...)
				ws.mu.Unlock()
				local = local[:0]
			}
			defer flush()
			for step := uint64(1); ctx.Err() == nil; step++ {
				ws.waitActive(ctx)
				seen := map[uint64]bool{}
				for i := range ids {
					id := rankID(zipf.Uint64())
					for seen[id] {
						id = rankID(zipf.Uint64())
					}
					seen[id] = true
					ids[i] = id
				}
				s := time.Now()
				if err := cl.Pull(ctx, "emb", ids, vals); err != nil {
					ws.fail(ctx, err)
					return
				}
				e := time.Now()
				local = append(local, repEvent{start: s, end: e, rows: batch})
				if ws.modeNow() == repTrain {
					if err := cl.Push(ctx, "emb", ids, grads, step); err != nil {
						ws.fail(ctx, err)
						return
					}
					local = append(local, repEvent{start: e, end: time.Now(), rows: batch, push: true})
					if !pushed {
						pushed = true
						ws.ready.Add(1)
					}
				}
				if len(local) >= 64 {
					flush()
				}
			}
		}()
	}
	return ws, nil
}

func (ws *repWorkers) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	ws.mu.Lock()
	if ws.err == nil {
		ws.err = err
	}
	ws.mu.Unlock()
}

func (ws *repWorkers) set(mode int) {
	ws.modeMu.Lock()
	defer ws.modeMu.Unlock()
	switch {
	case mode == repIdle && ws.cur != repIdle:
		ws.resume = make(chan struct{})
	case mode != repIdle && ws.cur == repIdle:
		close(ws.resume)
	}
	ws.cur = mode
}

// waitActive returns once the workers are not idle, or ctx is done.
func (ws *repWorkers) waitActive(ctx context.Context) {
	ws.modeMu.Lock()
	idle, resume := ws.cur == repIdle, ws.resume
	ws.modeMu.Unlock()
	if idle {
		select {
		case <-resume:
		case <-ctx.Done():
		}
	}
}

func (ws *repWorkers) modeNow() int {
	ws.modeMu.Lock()
	defer ws.modeMu.Unlock()
	return ws.cur
}

func (ws *repWorkers) stop() error {
	ws.cancel()
	ws.wg.Wait()
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.err
}

// rate is the rows per second of the batches (pulls) that ended in [from, to).
func (ws *repWorkers) rate(from, to time.Time) float64 {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	rows := 0
	for _, e := range ws.events {
		if !e.push && !e.end.Before(from) && e.end.Before(to) {
			rows += e.rows
		}
	}
	return float64(rows) / to.Sub(from).Seconds()
}

// maxLatency is the longest request that overlapped [from, to).
func (ws *repWorkers) maxLatency(from, to time.Time) time.Duration {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var m time.Duration
	for _, e := range ws.events {
		if e.end.After(from) && e.start.Before(to) {
			m = max(m, e.end.Sub(e.start))
		}
	}
	return m
}

// stopRestart checkpoints the job's servers to storage, stops them, starts 3 servers that
// restore the checkpoint from storage, and times until every worker has trained one batch on
// them.
func (p repParams) stopRestart(ctx context.Context, job *repJob) (time.Duration, error) {
	store, err := checkpoint.NewFSStorage(filepath.Join(p.dir, "store"))
	if err != nil {
		return 0, err
	}
	committer, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "rep", Storage: store})
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	old := job.holder.Get()
	var refs []checkpoint.ManifestRef
	for _, n := range job.nodes() {
		job.mu.Lock()
		srv := job.srvs[n.ID]
		job.mu.Unlock()
		tab, _ := srv.Table("emb")
		ck, err := checkpoint.New(checkpoint.Config{Job: "rep", Node: n.ID, Tables: map[string]checkpoint.Table{"emb": tab}, Storage: store, ShmDir: p.shm, FullEvery: 1})
		if err != nil {
			return 0, err
		}
		if _, err := ck.Snapshot(ctx, 1, checkpoint.SnapshotSlots(old.SlotsOf(n.ID).Members())); err != nil {
			ck.Close()
			return 0, err
		}
		ref, err := ck.WaitPersisted(ctx, 1)
		ck.Close()
		if err != nil {
			return 0, err
		}
		refs = append(refs, ref)
	}
	if _, err := committer.Commit(ctx, 1, refs); err != nil {
		return 0, err
	}
	job.close()
	// New servers on new hosts: the shared memory is gone.
	if err := os.RemoveAll(filepath.Join(p.shm, "rep")); err != nil {
		return 0, err
	}
	runtime.GC()
	debug.FreeOSMemory()
	fresh := &repJob{p: p, srvs: map[string]*ps.Server{}, addrs: map[string]string{}}
	defer fresh.close()
	ids := []string{"ps-a", "ps-b", "ps-c"}
	for _, id := range ids {
		if err := fresh.add(id); err != nil {
			return 0, err
		}
	}
	t, err := ps.NewOwnerTable(old.Version+1, old.Slots, fresh.nodes(), nil)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tab, _ := fresh.srvs[id].Table("emb")
			ck, err := checkpoint.New(checkpoint.Config{Job: "rep", Node: id, Tables: map[string]checkpoint.Table{"emb": tab}, Storage: store, ShmDir: p.shm})
			if err != nil {
				errs[i] = err
				return
			}
			defer ck.Close()
			_, errs[i] = ck.Load(ctx, 1, checkpoint.RestoreSlots(t.SlotsOf(id).Members()), checkpoint.RestoreFromStorage())
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if err := fresh.publish(ctx, t); err != nil {
		return 0, err
	}
	ws, err := fresh.startWorkers(ctx, p.workers, p.batch, p.perServer*2)
	if err != nil {
		return 0, err
	}
	ws.set(repTrain)
	for {
		if err := ctx.Err(); err != nil {
			ws.stop()
			return 0, err
		}
		if ws.ready.Load() >= int64(p.workers) {
			break
		}
		sleepCtx(ctx, time.Millisecond)
	}
	d := time.Since(t0)
	return d, ws.stop()
}

func ms2(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
