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
//
// With -moveprof.train the workers train (pull and push) throughout instead: a profile of
// training alone (train.prof) comes first, and each move's CPU per row is its window's CPU less
// what its training cost at the rate before, as in the suite.
var (
	moveProfDir   = flag.String("moveprof", "", "directory for TestMoveCPU's profiles; the test is skipped without it")
	moveProfRows  = flag.Int("moveprof.rows", 4<<20, "rows per server for TestMoveCPU")
	moveProfTrain = flag.Bool("moveprof.train", false, "TestMoveCPU: train during the moves")
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
	pullCPU := c1.sub(c0).total().Seconds() * 1e6 / (pull * t1.Sub(t0).Seconds())
	t.Logf("pull: %.0f rows/s, %.3f us of CPU per row", pull, pullCPU)
	trainCPU := 0.0 // us per row trained, with -moveprof.train
	if *moveProfTrain {
		ws.set(repTrain)
		time.Sleep(rp.phase / 4)
		f, err := os.Create(filepath.Join(*moveProfDir, "train.prof"))
		if err != nil {
			t.Fatal(err)
		}
		pprof.StartCPUProfile(f)
		c0, _ := selfCPU()
		t0 := time.Now()
		time.Sleep(rp.phase)
		t1 := time.Now()
		c1, _ := selfCPU()
		pprof.StopCPUProfile()
		f.Close()
		rate := ws.rate(t0, t1)
		trainCPU = c1.sub(c0).total().Seconds() * 1e6 / (rate * t1.Sub(t0).Seconds())
		t.Logf("train: %.0f rows/s, %.3f us of CPU per row", rate, trainCPU)
	} else if err := ws.stop(); err != nil {
		t.Fatal(err)
	}
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
			if *moveProfTrain {
				trained := ws.rate(s, s.Add(d)) * d.Seconds()
				move := (cpu.total().Seconds()*1e6 - trained*trainCPU) / rows
				t.Logf("scale-%s %d: %.2f s, %d rows, %.0f rows/s, training at %.0f rows/s, %.3f us of CPU per row moved less training, %.2f of a pulled row's",
					dir, round, d.Seconds(), p.BaseRows, rows/d.Seconds(), trained/d.Seconds(), move, move/pullCPU)
				continue
			}
			t.Logf("scale-%s %d: %.2f s, %d rows, %.0f rows/s, %.3f us of CPU per row (user %.3f, system %.3f), %.2f of a pulled row's",
				dir, round, d.Seconds(), p.BaseRows, rows/d.Seconds(), cpu.total().Seconds()*1e6/rows,
				cpu.user.Seconds()*1e6/rows, cpu.sys.Seconds()*1e6/rows, cpu.total().Seconds()*1e6/rows/pullCPU)
		}
	}
	if err := ws.stop(); err != nil {
		t.Fatal(err)
	}
}
