package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
)

// Where the CPU of one pull goes, for the ps suite's comparisons with Redis and gRPC. Run
//
//	go test ./examples/bench -run PSPullCPU -v -psprof DIR
//
// (skipped without -psprof). It builds the ps suite's setting (2 servers in this process holding
// 2 x 4 M rows of dim 64, batches of 4096 Zipf(1.1) ids, 2 goroutines, psConns connections, one
// Redis instance per server, the gRPC peer in plaintext and over TLS) and makes the same pull
// calls through each subject in rounds, A B C ... rotated each round as the suite's interleave
// does, so that the machine's other work falls on every subject alike. For every round and
// subject it measures the CPU per call: this process's (client and, except for Redis, servers)
// from getrusage, and the Redis instances' from /proc/PID/stat; and it writes a CPU profile of
// those calls (NAME-ROUND.prof). At the end the profiles of each subject are merged and their
// samples sorted into the buckets of psBuckets (go tool pprof -traces), in microseconds of CPU
// per call; the table, and the per-round CPU ratios of each peer over our pulls (median and
// range), go to the log and to summary.txt. Do not pass -cpuprofile as well.
var (
	psProfDir    = flag.String("psprof", "", "directory for TestPSPullCPU's profiles and summary; the test is skipped without it")
	psProfRows   = flag.Int("psprof.rows", 4<<20, "rows per server for TestPSPullCPU (the ps suite's size by default)")
	psProfRounds = flag.Int("psprof.rounds", 5, "rounds of TestPSPullCPU")
	psProfCalls  = flag.Int("psprof.calls", 3000, "pull calls per subject and round of TestPSPullCPU")
)

// psSubject is one way to pull a batch, profiled by TestPSPullCPU.
type psSubject struct {
	name  string
	pull  func(g int, ids []uint64, out []float32) error
	redis bool
}

// psRound is what one round measured of one subject.
type psRound struct {
	self, redis procCPU
	wall        time.Duration
}

func TestPSPullCPU(t *testing.T) {
	if *psProfDir == "" {
		t.Skip("profiles pulls only when asked: -psprof DIR")
	}
	const dim, batch, servers, goroutines, batches = 64, 4096, 2, 2, 120
	redisBin, err := redisServerPath()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(*psProfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tcfg := embedding.Config{Dim: dim, Seed: 1, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}
	cl, err := startCluster(servers, tcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.close()
	local, err := embedding.New(tcfg)
	if err != nil {
		t.Fatal(err)
	}
	rows := *psProfRows * servers
	if err := cl.fill(rows, local); err != nil {
		t.Fatal(err)
	}
	zipf := rankIDs(zipfStream(rows, batch*batches, 7))
	f := newFolder(batch, dim)
	distinct := 0
	for k := range batches {
		f.fold(zipf[k*batch : (k+1)*batch])
		distinct += len(f.uniq)
	}
	// Redis holds what it holds in the suite: the rows of the Zipf and the all-distinct streams.
	distinctIDs := rankIDs(distinctZipfStream(rows, batch, batches, 8))
	red, err := startRedis(ctx, options{dir: t.TempDir()}, redisBin, cl, goroutines, local, dim, zipf, distinctIDs)
	if err != nil {
		t.Fatal(err)
	}
	defer red.stop()
	gp, err := startGRPC(cl, goroutines, dim, false)
	if err != nil {
		t.Fatal(err)
	}
	defer gp.stop()
	gt, err := startGRPC(cl, goroutines, dim, true)
	if err != nil {
		t.Fatal(err)
	}
	defer gt.stop()
	ours := func(p ps.Protection) func(g int, ids []uint64, out []float32) error {
		cs, err := cl.clients(goroutines, p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeClients(cs) })
		return func(g int, ids []uint64, out []float32) error { return cs[g].Pull(ctx, "emb", ids, out) }
	}
	folders := []*folder{newFolder(batch, dim), newFolder(batch, dim)}
	subjects := []psSubject{
		{"ours_integrity", ours(ps.ProtectIntegrity), false},
		{"ours_unprotected", ours(ps.ProtectNone), false},
		{"ours_encrypted", ours(ps.ProtectEncrypt), false},
		{"grpc", func(g int, ids []uint64, out []float32) error { return gp.clients[g].pull(ctx, ids, out) }, false},
		{"grpc_tls", func(g int, ids []uint64, out []float32) error { return gt.clients[g].pull(ctx, ids, out) }, false},
		{"redis", red.pull, true},
		{"local", func(g int, ids []uint64, out []float32) error { return folders[g].lookup(local, ids, out) }, false},
	}
	for _, s := range subjects { // warm: connections, buffers, pools
		if _, err := parallelBatches(goroutines, zipf[:4*goroutines*batch], batch, dim, s.pull); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
	runtime.GC()

	calls := *psProfCalls
	got := map[string][]psRound{}
	profs := map[string][]string{}
	for r := range *psProfRounds {
		for i := range subjects {
			s := subjects[(r+i)%len(subjects)]
			path := filepath.Join(*psProfDir, fmt.Sprintf("%s-%d.prof", s.name, r+1))
			m, err := profileCalls(s, path, red, zipf, batch, dim, goroutines, calls)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			got[s.name] = append(got[s.name], m)
			profs[s.name] = append(profs[s.name], path)
		}
	}

	var sb strings.Builder
	fmt.Fprintf(&sb, "CPU per pull call of %d ids (%.0f distinct on average), %d rows of dim %d on %d servers, %d goroutines; %d rounds of %d calls per subject\n\n",
		batch, float64(distinct)/batches, rows, dim, servers, goroutines, *psProfRounds, calls)
	tw := tabwriter.NewWriter(&sb, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "subject\tCPU µs/call median [min-max]\tthis process user+sys\tRedis user+sys\trows/s median\t\n")
	cpu := func(m psRound) float64 {
		return (m.self.user + m.self.sys + m.redis.user + m.redis.sys).Seconds() * 1e6 / float64(calls)
	}
	for _, s := range subjects {
		var c, rate, su, ss, ru, rs []float64
		for _, m := range got[s.name] {
			c = append(c, cpu(m))
			rate = append(rate, float64(calls*batch)/m.wall.Seconds())
			su, ss = append(su, m.self.user.Seconds()*1e6/float64(calls)), append(ss, m.self.sys.Seconds()*1e6/float64(calls))
			ru, rs = append(ru, m.redis.user.Seconds()*1e6/float64(calls)), append(rs, m.redis.sys.Seconds()*1e6/float64(calls))
		}
		sp := spreadOf(c)
		redis := "-"
		if s.redis {
			redis = fmt.Sprintf("%.0f+%.0f", median(ru), median(rs))
		}
		fmt.Fprintf(tw, "%s\t%.0f [%.0f-%.0f]\t%.0f+%.0f\t%s\t%s\t\n", s.name, sp.med, sp.lo, sp.hi, median(su), median(ss), redis, formatValue(median(rate)))
	}
	tw.Flush()

	fmt.Fprintf(&sb, "\nper-round ratios of CPU per call, A / B (for a peer over ours, the rows/s ratio ours/peer would be this if CPU alone bounded both)\n")
	tw = tabwriter.NewWriter(&sb, 0, 4, 2, ' ', tabwriter.AlignRight)
	for _, pair := range [][2]string{
		{"redis", "ours_integrity"}, {"redis", "ours_unprotected"},
		{"grpc", "ours_integrity"}, {"grpc", "ours_unprotected"},
		{"grpc_tls", "ours_encrypted"}, {"grpc_tls", "ours_integrity"},
		{"ours_integrity", "local"}, {"ours_unprotected", "local"},
	} {
		a, b := got[pair[0]], got[pair[1]]
		var q []float64
		for r := range min(len(a), len(b)) {
			q = append(q, cpu(a[r])/cpu(b[r]))
		}
		sp := spreadOf(q)
		fmt.Fprintf(tw, "%s / %s\t%.2f\t[%.2f-%.2f]\t\n", pair[0], pair[1], sp.med, sp.lo, sp.hi)
	}
	tw.Flush()

	fmt.Fprintf(&sb, "\nCPU profile samples by bucket, µs per call (all rounds merged)\n")
	tw = tabwriter.NewWriter(&sb, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "subject\t%s\tprofiled\t\n", strings.Join(psBucketOrder, "\t"))
	var others strings.Builder
	for _, s := range subjects {
		sums, total, top, err := psProfileBuckets(profs[s.name])
		if err != nil {
			t.Fatal(err)
		}
		n := float64(calls * len(profs[s.name]))
		fmt.Fprintf(tw, "%s", s.name)
		for _, k := range psBucketOrder {
			fmt.Fprintf(tw, "\t%.0f", sums[k].Seconds()*1e6/n)
		}
		fmt.Fprintf(tw, "\t%.0f\t\n", total.Seconds()*1e6/n)
		for _, o := range top {
			fmt.Fprintf(&others, "  %s other: %s %.1f µs/call\n", s.name, o.name, o.d.Seconds()*1e6/n)
		}
	}
	tw.Flush()
	sb.WriteString("\nlargest leaf frames in \"other\"\n" + others.String())
	t.Logf("\n%s", sb.String())
	if err := os.WriteFile(filepath.Join(*psProfDir, "summary.txt"), []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// profileCalls makes calls pull calls through s on goroutines goroutines, cycling over the
// batches of ids, under a CPU profile written to path, and returns the CPU they cost.
func profileCalls(s psSubject, path string, red *redisPeer, ids []uint64, batch, dim, goroutines, calls int) (psRound, error) {
	f, err := os.Create(path)
	if err != nil {
		return psRound{}, err
	}
	defer f.Close()
	batches := len(ids) / batch
	if err := pprof.StartCPUProfile(f); err != nil {
		return psRound{}, err
	}
	var redis0 []procCPU
	if s.redis {
		if redis0, err = redisCPU(red); err != nil {
			pprof.StopCPUProfile()
			return psRound{}, err
		}
	}
	self0, err := selfCPU()
	if err != nil {
		pprof.StopCPUProfile()
		return psRound{}, err
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]float32, batch*dim)
			for i := g; i < calls; i += goroutines {
				k := i % batches
				if err := s.pull(g, ids[k*batch:(k+1)*batch], out); err != nil {
					errs[g] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	m := psRound{wall: time.Since(start)}
	self1, err := selfCPU()
	if err == nil && s.redis {
		var redis1 []procCPU
		if redis1, err = redisCPU(red); err == nil {
			for i := range redis1 {
				d := redis1[i].sub(redis0[i])
				m.redis.user, m.redis.sys = m.redis.user+d.user, m.redis.sys+d.sys
			}
		}
	}
	pprof.StopCPUProfile()
	m.self = self1.sub(self0)
	return m, errors.Join(append(errs, err)...)
}

// redisCPU reads the CPU times of the Redis instances from /proc/PID/stat (fields utime and
// stime, in clock ticks of 10 ms on Linux).
func redisCPU(p *redisPeer) ([]procCPU, error) {
	out := make([]procCPU, len(p.cmds))
	for i, cmd := range p.cmds {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		if err != nil {
			return nil, err
		}
		// The fields after the command name, which is in parentheses: state is field 3, utime 14.
		f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+1:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		out[i] = procCPU{time.Duration(u) * 10 * time.Millisecond, time.Duration(s) * 10 * time.Millisecond}
	}
	return out, nil
}

// psBuckets sorts a sample by its stack, leaf first. The first rule that matches any frame of
// the stack wins, so allocation under a codec counts as allocation, a goroutine parked in a read
// counts as scheduling, and a read or write counts as the kernel's (the profile's samples count
// system time too, in the frame that made the system call); then the innermost frame outside the
// runtime names the owner (psOwners). Buffers a codec clears itself (grpc-go's pool clears every
// buffer it hands out) count as the codec's.
var psBuckets = []struct {
	name     string
	anyFrame []string // prefixes of a frame anywhere in the stack
}{
	{"alloc/GC", []string{"runtime.mallocgc", "runtime.gcBgMarkWorker", "runtime.gcAssist", "runtime.gcDrain", "runtime.bgsweep",
		"runtime.bgscavenge", "runtime.(*mheap)", "runtime.(*mcache)", "runtime.(*mcentral)", "runtime.sweepone", "runtime.gcStart",
		"runtime.scanobject", "runtime.markroot", "runtime.wbBuf", "runtime.bulkBarrier", "runtime.gcMark"}},
	{"sched/hand-off", []string{"runtime.schedule", "runtime.findRunnable", "runtime.park_m", "runtime.gopark", "runtime.goready",
		"runtime.ready", "runtime.wakep", "runtime.startm", "runtime.stopm", "runtime.notesleep", "runtime.notewakeup",
		"runtime.futex", "runtime.netpoll", "runtime.usleep", "runtime.osyield", "runtime.mPark", "runtime.newproc",
		"runtime.goexit0", "runtime.chansend", "runtime.chanrecv", "runtime.selectgo", "runtime.semrelease", "runtime.semacquire",
		"runtime.mcall", "runtime.exitsyscall0", "runtime.handoffp", "runtime.sysmon", "runtime.lock2", "runtime.unlock2",
		"runtime.runqsteal", "runtime.runqgrab", "sync.(*Mutex).lockSlow", "sync.(*Mutex).unlockSlow", "sync.runtime_",
		"runtime.gcstopm", "runtime.resetspinning", "runtime.checkTimers", "runtime.(*timers)", "runtime.casgstatus",
		"runtime.newstack", "runtime.copystack", "runtime.morestack"}},
	// Before crypto: TLS reads and writes its records through the socket.
	{"kernel socket", []string{"syscall.", "internal/poll.", "internal/runtime/syscall.", "golang.org/x/sys/unix."}},
	{"crypto", []string{"crypto/"}},
}

// psOwners names the bucket of the innermost frame outside the runtime, by prefix.
var psOwners = []struct{ prefix, bucket string }{
	{"github.com/elasticps/elasticps/embedding.Slot", "fold/scatter"}, // a client finding an id's owner
	{"github.com/elasticps/elasticps/embedding.", "lookup"},
	{"github.com/elasticps/elasticps/ps.(*clientScratch).", "fold/scatter"},
	{"github.com/elasticps/elasticps/ps.getFloats", "fold/scatter"},
	{"github.com/elasticps/elasticps/ps.idHash", "fold/scatter"},
	{"github.com/elasticps/elasticps/ps.hashSlot", "fold/scatter"},
	{"github.com/elasticps/elasticps/ps.(*OwnerTable).OwnerIndex", "fold/scatter"},
	{"github.com/elasticps/elasticps/ps.(*Client).Pull.func1", "fold/scatter"},
	{"github.com/elasticps/elasticps/examples/bench.(*folder)", "fold/scatter"},
	{"github.com/elasticps/elasticps/examples/bench.split", "fold/scatter"},
	{"github.com/elasticps/elasticps/examples/bench.(*psCluster).owner", "fold/scatter"},
	{"github.com/elasticps/elasticps/examples/bench.(*grpcClient).pull.func1", "fold/scatter"},
	{"github.com/elasticps/elasticps/examples/bench.(*redisPeer).pull", "fold/scatter"},
	{"github.com/elasticps/elasticps/ps.(*Server).checkIDsLocked", "ps bookkeeping"},
	{"github.com/elasticps/elasticps/ps.(*Server).servesLocked", "ps bookkeeping"},
	{"github.com/elasticps/elasticps/ps.slotOf", "ps bookkeeping"},
	{"github.com/elasticps/elasticps/ps.(*stats)", "ps bookkeeping"},
	{"github.com/elasticps/elasticps/ps.(*Server).putScratch", "ps bookkeeping"},
	{"github.com/elasticps/elasticps/ps.(*Server).scratch", "ps bookkeeping"},
	{"github.com/elasticps/elasticps/ps.(*Server).handlePull", "ps bookkeeping"},
	{"github.com/elasticps/elasticps/ps.", "framing/codec"},
	{"github.com/elasticps/elasticps/internal/", "framing/codec"},
	{"github.com/elasticps/elasticps/examples/bench.(*respConn)", "framing/codec"},
	{"github.com/elasticps/elasticps/examples/bench.respInt", "framing/codec"},
	{"github.com/elasticps/elasticps/examples/bench.(*grpcTable)", "framing/codec"},
	{"github.com/elasticps/elasticps/examples/bench.(*grpcClient)", "framing/codec"},
	{"google.golang.org/", "framing/codec"},
	{"golang.org/x/net/", "framing/codec"},
	{"bufio.", "framing/codec"},
	{"io.", "framing/codec"},
	{"encoding/binary.", "framing/codec"},
}

var psBucketOrder = []string{"lookup", "fold/scatter", "framing/codec", "ps bookkeeping", "crypto", "kernel socket", "sched/hand-off", "alloc/GC", "other"}

// psBucket returns the bucket of a stack (leaf first).
func psBucket(stack []string) string {
	for _, b := range psBuckets {
		for _, fr := range stack {
			for _, p := range b.anyFrame {
				if strings.HasPrefix(fr, p) {
					return b.name
				}
			}
		}
	}
	for _, fr := range stack {
		if psSkip(fr) {
			continue
		}
		for _, o := range psOwners {
			if strings.HasPrefix(fr, o.prefix) {
				return o.bucket
			}
		}
		return "other"
	}
	return "other"
}

// psSkip reports whether a frame is a helper whose caller owns its cost: the runtime's and the
// standard library's primitives (copies, locks, searches, number formatting), assembly bodies.
func psSkip(fr string) bool {
	for _, p := range []string{"runtime.", "internal/", "sync.", "sync/atomic.", "bytes.", "strconv.", "unicode/", "github.com/cespare/xxhash/"} {
		if strings.HasPrefix(fr, p) {
			return true
		}
	}
	return !strings.Contains(fr, ".") // assembly bodies: indexbytebody, memeqbody, aeshashbody
}

// psOther is a leaf frame of the samples left in "other", with their CPU.
type psOther struct {
	name string
	d    time.Duration
}

// psProfileBuckets merges the CPU profiles at paths with `go tool pprof -traces` and sorts their
// samples into buckets (psBucket); it returns the CPU of each bucket, the total, and the largest
// leaf frames of "other".
func psProfileBuckets(paths []string) (map[string]time.Duration, time.Duration, []psOther, error) {
	out, err := exec.Command("go", append([]string{"tool", "pprof", "-traces"}, paths...)...).Output()
	if err != nil {
		return nil, 0, nil, fmt.Errorf("go tool pprof -traces: %w", err)
	}
	sums := map[string]time.Duration{}
	others := map[string]time.Duration{}
	var total, cur time.Duration
	var stack []string
	flush := func() {
		if len(stack) > 0 {
			k := psBucket(stack)
			sums[k] += cur
			total += cur
			if k == "other" {
				others[stack[0]] += cur
			}
		}
		stack, cur = stack[:0], 0
	}
	// Each sample: a line of dashes, then "<cpu>  <leaf frame>", then one caller per line; inlined
	// frames end in " (inline)".
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 0:
		case strings.HasPrefix(f[0], "-----------+"):
			flush()
		case len(stack) == 0 && len(f) >= 2:
			if d, err := time.ParseDuration(f[0]); err == nil {
				cur, stack = d, append(stack, f[1])
			}
		case len(stack) > 0 && (len(f) == 1 || f[1] == "(inline)"):
			stack = append(stack, f[0])
		}
	}
	flush()
	if total == 0 {
		return nil, 0, nil, fmt.Errorf("no samples in %v", paths)
	}
	var top []psOther
	for k, v := range others {
		top = append(top, psOther{k, v})
	}
	slices.SortFunc(top, func(a, b psOther) int { return int(b.d - a.d) })
	return sums, total, top[:min(3, len(top))], nil
}
