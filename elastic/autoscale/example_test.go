package autoscale_test

import (
	"fmt"
	"time"

	"github.com/elasticps/elasticps/elastic/autoscale"
)

// A job starts from the model of a similar earlier job, is re-planned as its measured
// throughput comes in (the servers' cores growing with the load each takes), and gets a server
// like the others when one stays hot.
func Example() {
	earlier := autoscale.Model{Base: 20e-6, WorkerCompute: 400e-6, ServerCompute: 150e-6, PerWorker: 10e-6, PerServer: 40e-6}
	history := []autoscale.JobRecord{{
		Job:     "ctr-monday",
		Profile: autoscale.JobProfile{Kind: "dlrm", ModelBytes: 8 << 30, DatasetSamples: 4e9, BatchSize: 512},
		Shape:   autoscale.Shape{Workers: 8, Servers: 4, Worker: autoscale.Resources{CPU: 4}, Server: autoscale.Resources{CPU: 4}},
		Model:   &earlier, PeakServerMemory: 5 << 30,
	}}
	p, err := autoscale.NewPlanner(autoscale.Config{MaxWorkers: 32, MaxServers: 8})
	if err != nil {
		panic(err)
	}
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	plan, err := p.Begin(autoscale.JobProfile{Kind: "dlrm", ModelBytes: 10 << 30, DatasetSamples: 5e9, BatchSize: 512}, history, start)
	if err != nil {
		panic(err)
	}
	fmt.Println(plan.Kind, plan.Shape)

	// The servers work twice as hard as the earlier job's model says, so at first one of
	// them is hot; the re-plan learns the job from the measured throughput.
	truth := earlier
	truth.ServerCompute *= 2
	shape := plan.Shape
	hot := 0.97
	for tick := 1; tick <= 24; tick++ {
		at := start.Add(time.Duration(tick) * 15 * time.Second)
		servers := []autoscale.ServerLoad{{ID: "ps-0", CPU: 0.6}, {ID: "ps-1", CPU: hot}}
		for _, d := range p.Observe(autoscale.Observation{At: at, Shape: shape, Throughput: truth.Throughput(shape), Servers: servers}) {
			fmt.Printf("%v %v %s -> %v\n", at.Sub(start), d.Kind, d.Target, d.Shape)
			shape, hot = d.Shape, 0.7
		}
	}
	// Output:
	// plan 17 workers x 4 CPU, 3 servers x 4 CPU 10.4 GiB
	// 45s add-server ps-1 -> 17 workers x 4 CPU, 4 servers x 4 CPU 10.4 GiB
	// 3m0s resize  -> 21 workers x 4 CPU, 4 servers x 5 CPU 10.4 GiB
	// 5m15s resize  -> 25 workers x 4 CPU, 4 servers x 6 CPU 10.4 GiB
}
