package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tracesDir is the project's shared copy of the public traces (each folder's ORIGIN.md gives
// its source and licence).
const tracesDir = "../../../../shared/data/traces"

// requireTraces skips the test when the shared data directory is not there, and fails it
// under CI (CI=true), so that a missing data path never turns these tests off there.
func requireTraces(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(tracesDir + "/" + PhillyPath); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("traces not found at %s, and CI must run the trace tests: %v", tracesDir, err)
		}
		t.Skipf("traces not found at %s (shared data directory absent): %v", tracesDir, err)
	}
}

// synthTraces writes small traces of every kind the loader reads, drawn from a seed.
func synthTraces(seed uint64) fstest.MapFS {
	r := rand.New(rand.NewPCG(seed, 1))
	fs := fstest.MapFS{}
	put := func(name, body string) { fs[name] = &fstest.MapFile{Data: []byte(body)} }

	var b strings.Builder
	b.WriteString("timestamp,duration,num_gpus,gpu_time,cluster\n")
	t0 := time.Date(2017, 10, 1, 0, 0, 0, 0, time.UTC)
	for i := range 400 {
		g := []int{1, 1, 1, 2, 4, 8}[r.IntN(6)]
		d := math.Exp(4 + 5*r.Float64())
		fmt.Fprintf(&b, "%s,%.1f,%d,%.1f,vc%d\n", t0.Add(time.Duration(i*97)*time.Second).Format("2006-01-02 15:04:05"), d, g, d*float64(g), i%3)
	}
	put(PhillyPath, b.String())

	b.Reset()
	b.WriteString("name,time,application,num_replicas,batch_size\n")
	for i := range 40 {
		app := []string{"ncf", "cifar10"}[i%2]
		fmt.Fprintf(&b, "%s-%d,%d,%s,%d,%d\n", app, i, i*200, app, 1+r.IntN(8), []int{512, 1024, 2048}[r.IntN(3)])
	}
	put(PolluxWorkloadsDir+"/workload-6.csv", b.String())
	for _, app := range []string{"ncf", "cifar10"} {
		b.Reset()
		b.WriteString("num_nodes,num_replicas,local_bsz,step_time,sync_time\n")
		for _, n := range []int{6, 8, 12, 16} {
			for _, lb := range []int{32, 128, 512, 1024} {
				fmt.Fprintf(&b, "%d,%d,%d,%g,%g\n", n, n, lb, 0.02+0.001*float64(n)+0.00002*float64(lb), 0.01)
			}
		}
		put(PolluxProfilesDir+"/"+app+"/scalability.csv", b.String())
		b.Reset()
		b.WriteString("placement,local_bsz,step_time,sync_time\n")
		for _, pl := range []string{"1", "2", "4"} {
			for _, lb := range []int{32, 128, 512, 1024} {
				fmt.Fprintf(&b, "%s,%d,%g,0.001\n", pl, lb, 0.01+0.00002*float64(lb))
			}
		}
		put(PolluxProfilesDir+"/"+app+"/placements.csv", b.String())
		put(PolluxProfilesDir+"/"+app+"/validation-256.csv", "progress,iteration,metric,grad_sqr,grad_var\n")
		put(PolluxProfilesDir+"/"+app+"/validation-4096.csv", "progress,iteration,metric,grad_sqr,grad_var\n")
	}

	b.Reset()
	types := []string{"ResNet-18 (batch size 64)", "Recommendation (batch size 512)", "LM (batch size 20)"}
	for i := range 200 {
		fmt.Fprintf(&b, "%s\tcmd\t-n\t1\t%d\t%d.000000\t%d\n", types[r.IntN(3)], 1000+r.IntN(200000), i*300, []int{1, 1, 2, 4, 8}[r.IntN(5)])
	}
	put(GavelTracesDir+"/vc0.trace", b.String())
	put(GavelThroughputPath, `{"v100": {
 "('ResNet-18 (batch size 64)', 1)": {"null": 24}, "('ResNet-18 (batch size 64)', 2)": {"null": 40},
 "('ResNet-18 (batch size 64)', 4)": {"null": 70}, "('ResNet-18 (batch size 64)', 8)": {"null": 120},
 "('Recommendation (batch size 512)', 1)": {"null": 23},
 "('LM (batch size 20)', 1)": {"null": 64}, "('LM (batch size 20)', 2)": {"null": 120},
 "('LM (batch size 20)', 4)": {"null": 110}, "('LM (batch size 20)', 8)": {"null": 400}}}`)

	b.Reset()
	b.WriteString(alibabaHeader)
	for i := range 60 {
		app := (i / 3) % 6
		if i%3 == 0 {
			fmt.Fprintf(&b, "i%d,HN,app_%d,8,8,1,1,25,25,%d,%d,1,1,8,,,\n", i, app, 16+8*app, 16+8*app)
		} else {
			fmt.Fprintf(&b, "i%d,CN,app_%d,%d,%d,0,0,1,1,%d,%d,1,1,-1,%d,%d,\n", i, app, 32+16*app, 32+16*app, 160+80*app, 160+80*app, i, i)
		}
	}
	put(AlibabaDLRMPath, b.String())
	put(MachineSpecPath, "m0,CPU,96,512,0\nm1,CPU,96,512,0\nm2,V100,96,512,8\n")
	return fs
}

func testSetup(t testing.TB, seed uint64) Setup {
	fig, err := DefaultRepartitionFigures()
	require.NoError(t, err)
	return Setup{Seed: seed, Repartition: fig, PS: PSOptions{Jobs: 60}, Gavel: GavelOptions{Jobs: 60, GPUs: 16}, Pollux: PolluxOptions{GPUs: 16}}
}

func TestSameSeedSameTable(t *testing.T) {
	tr, err := LoadTraces(synthTraces(1))
	require.NoError(t, err)
	a, err := RunComparisons(tr, testSetup(t, 3))
	require.NoError(t, err)
	b, err := RunComparisons(tr, testSetup(t, 3))
	require.NoError(t, err)
	require.Len(t, a, 4)
	assert.Equal(t, Table(a), Table(b))
	c, err := RunComparisons(tr, testSetup(t, 4))
	require.NoError(t, err)
	assert.NotEqual(t, Table(a), Table(c), "the seed picks the workload")
	for _, cmp := range a {
		for _, r := range cmp.Results {
			assert.Positive(t, r.Summary().Completed, "%s: %s completed nothing", cmp.Name, r.Policy)
		}
	}
}

func TestLoadTracesReportsTheBadFile(t *testing.T) {
	fs := synthTraces(1)
	fs[GavelTracesDir+"/vc0.trace"] = &fstest.MapFile{Data: []byte("A3C\tcmd\t-n\t1\t100\t0.0\t1\nA3C\tcmd\t-n\t1\t-5\t0.0\t1\n")}
	_, err := LoadTraces(fs)
	require.Error(t, err)
	assert.Contains(t, err.Error(), GavelTracesDir+"/vc0.trace:2:")
	delete(fs, AlibabaDLRMPath)
	_, err = LoadTraces(fs)
	assert.ErrorContains(t, err, AlibabaDLRMPath)
}

// TestRealTraces runs the comparisons on the shared traces: every workload builds, every
// policy completes jobs, and the table is the same from the same seed.
func TestRealTraces(t *testing.T) {
	requireTraces(t)
	tr, err := LoadTraces(os.DirFS(tracesDir))
	require.NoError(t, err)
	assert.Len(t, tr.Philly, 82247)
	assert.Len(t, tr.PolluxWorkloads, 8)
	assert.Contains(t, tr.PolluxProfiles, "ncf")
	assert.Len(t, tr.Gavel, 15)
	assert.Len(t, tr.Alibaba, 23871)
	setup := testSetup(t, 1)
	setup.PS.Jobs, setup.Gavel.Jobs, setup.Gavel.GPUs, setup.Pollux.GPUs = 80, 80, 32, 64
	a, err := RunComparisons(tr, setup)
	require.NoError(t, err)
	b, err := RunComparisons(tr, setup)
	require.NoError(t, err)
	assert.Equal(t, Table(a), Table(b))
	for _, cmp := range a {
		for _, row := range cmp.Rows {
			assert.False(t, math.IsNaN(row.Measured) || math.IsInf(row.Measured, 0), "%s: %s", cmp.Name, row.Metric)
		}
	}
}
