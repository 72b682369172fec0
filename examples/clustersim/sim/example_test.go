package sim_test

import (
	"fmt"

	"github.com/elasticps/elasticps/examples/clustersim/sim"
)

// Two GPU jobs on a node of 4 GPUs: the default scheduler runs them as asked, so the second
// waits for the first to end; progress-aware allocation shrinks the first to start the second
// at once and gives the GPUs back as the second nears its end.
func Example() {
	perf := &sim.CurvePerf{GPUs: []int{1, 2, 4}, Rate: []float64{1, 1.8, 3.2}}
	job := func(id int, arrival float64, gpus int, seconds float64) *sim.Job {
		c := sim.Config{Workers: gpus, WorkerCPU: 4, WorkerMem: 16, WorkerGPU: 1}
		return &sim.Job{ID: id, Name: fmt.Sprint("job-", id), Arrival: arrival, Kind: sim.GPU, Request: c, Perf: perf, Work: seconds * perf.Throughput(c)}
	}
	w := &sim.Workload{Name: "two jobs", Nodes: []sim.NodeSpec{{Count: 1, Resources: sim.Resources{CPU: 32, Mem: 128, GPU: 4}}},
		Jobs: []*sim.Job{job(0, 0, 4, 3600), job(1, 60, 2, 1800)}}
	for _, p := range []sim.Policy{sim.FIFO{Label: "default"}, &sim.ProgressAware{}} {
		r, err := sim.Run(w, p, sim.Options{Cost: sim.FixedRestartCost{Seconds: 30}})
		if err != nil {
			fmt.Println(err)
			return
		}
		s := r.Summary()
		fmt.Printf("%s: %d completed, mean JCT %.0f s, makespan %.0f s\n", r.Policy, s.Completed, s.MeanJCT, s.Makespan)
	}
	// Output:
	// default: 2 completed, mean JCT 4470 s, makespan 5400 s
	// progress-aware: 2 completed, mean JCT 2921 s, makespan 4547 s
}
