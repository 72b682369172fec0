package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/elasticps/elasticps/ps"
)

// Where the CPU of a live move goes, with nothing else running. Run
//
//	go test ./examples/bench -run MoveCPU -v -moveprof DIR
//
// (skipped without -moveprof). It builds the repartition suite's job (2 servers of
// -moveprof.rows rows of dim 64 with Adagrad, over loopback TCP), measures the CPU per row of
// the suite's 4 workers pulling, stops them, and then moves the job from 2 to 3 servers and
// back, 3 times, measuring this process's CPU per row moved (getrusage) and writing a CPU
// profile of each move (out1.prof, in1.prof, ...). The first scale-out fills a fresh server,
// so it also pays for faulting in its memory.
var (
	moveProfDir  = flag.String("moveprof", "", "directory for TestMoveCPU's profiles; the test is skipped without it")
	moveProfRows = flag.Int("moveprof.rows", 4<<20, "rows per server for TestMoveCPU")
)

func TestMoveCPU(t *testing.T) {
	if *moveProfDir == "" {
		t.Skip("no -moveprof")
	}
	ctx := context.Background()
	rp := repParams{perServer: *moveProfRows, batch: 1024, workers: 4, phase: 2 * time.Second}
	rp.dir = t.TempDir()
	rp.secret = make([]byte, 32)
	rand.Read(rp.secret)
	job, err := rp.start(ctx, []string{"ps-0", "ps-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer job.close()
	if err := job.fill(rp.perServer * 2); err != nil {
		t.Fatal(err)
	}
	m, err := ps.NewMigrator(ps.MigratorConfig{Secret: rp.secret})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := job.add("ps-2"); err != nil {
		t.Fatal(err)
	}
	ws, err := job.startWorkers(ctx, rp.workers, rp.batch, rp.perServer*2)
	if err != nil {
		t.Fatal(err)
	}
	ws.set(repPull)
	c0, err := selfCPU()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	time.Sleep(rp.phase)
	t1 := time.Now()
	c1, _ := selfCPU()
	pull := ws.rate(t0, t1)
	if err := ws.stop(); err != nil {
		t.Fatal(err)
	}
	pullCPU := c1.sub(c0).total().Seconds() * 1e6 / (pull * t1.Sub(t0).Seconds())
	t.Logf("pull: %.0f rows/s, %.3f us of CPU per row", pull, pullCPU)
	for round := 1; round <= 3; round++ {
		for _, dir := range []string{"out", "in"} {
			cur := job.holder.Get()
			nodes := job.nodes()
			if dir == "in" {
				nodes = job.nodes("ps-0", "ps-1")
			}
			next, err := ps.NewOwnerTable(0, cur.Slots, nodes, cur)
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.Create(filepath.Join(*moveProfDir, fmt.Sprintf("%s%d.prof", dir, round)))
			if err != nil {
				t.Fatal(err)
			}
			pprof.StartCPUProfile(f)
			c0, _ := selfCPU()
			s := time.Now()
			_, err = m.Migrate(ctx, cur, next, job.publish)
			d := time.Since(s)
			c1, _ := selfCPU()
			pprof.StopCPUProfile()
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			p := m.Progress()
			cpu, rows := c1.sub(c0), float64(p.BaseRows)
			t.Logf("scale-%s %d: %.2f s, %d rows, %.0f rows/s, %.3f us of CPU per row (user %.3f, system %.3f), %.2f of a pulled row's",
				dir, round, d.Seconds(), p.BaseRows, rows/d.Seconds(), cpu.total().Seconds()*1e6/rows,
				cpu.user.Seconds()*1e6/rows, cpu.sys.Seconds()*1e6/rows, cpu.total().Seconds()*1e6/rows/pullCPU)
		}
	}
}
