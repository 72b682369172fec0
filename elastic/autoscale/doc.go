// Package autoscale recommends a training job's resources and re-sizes it while it runs: the
// three stages of DLRover-RM (Wang et al., VLDB 2024) over the elastic coordinator.
//
// # The model
//
// A Model predicts a job's throughput (samples per second) from its Shape: workers, parameter
// servers and the cores of each. It is the Optimus form, a worker's seconds per sample being
//
//	t = Base + WorkerCompute/cw + ServerCompute*w/(p*cs) + PerWorker*w + PerServer*p
//
// and the throughput w/t: concave and saturating in the workers, with a best number of
// servers. Fit finds the non-negative coefficients that best explain measured Samples (NNLS,
// the Lawson-Hanson active-set method), drawn towards a Prior where the samples leave them
// open.
//
// # The planner
//
// A Planner, built from a Config of quota and thresholds (every zero field a documented
// default), makes every decision; it does no I/O and reads no clock, so a simulator drives it
// as the coordinator does:
//
//	p, err := autoscale.NewPlanner(autoscale.Config{MaxWorkers: 16, MaxServers: 8})
//	first, err := p.Begin(profile, history, now) // stage 1: Plan, from the job's profile and earlier jobs
//	for each tick {
//		for _, d := range p.Observe(autoscale.Observation{At: now, Shape: running, Throughput: x, Servers: ..., Workers: ...}) {
//			... // carry out d: d.Kind, d.Target, d.Shape, d.Size; d.Reason says why
//		}
//	}
//	err = autoscale.AppendHistory(path, p.Record(job, profile, now), 100) // for the next job
//
// The stages:
//
//  1. Begin: the nearest earlier job in the history (LoadHistory, AppendHistory: a JSON file
//     replaced atomically) by model size, dataset size and batch size gives the model, the
//     process sizes and the server memory per model byte; the plan has as many servers as the
//     memory needs and the model suggests, and as many workers as the model finds worth it.
//  2. Observe re-plans every ReplanEvery, once a shape has Settle samples and Cooldown has
//     passed since the last change: it fits the model to the measurements of the newest Window shapes and adds
//     the worker or server of highest marginal efficiency (throughput gained per core over
//     throughput per core) while that is at least AddEfficiency and the quota allows, or
//     removes those whose loss per core is below RemoveEfficiency (Resize), within the quota's
//     counts, cores (MaxCPU) and memory (MaxMemory); a change of the server count spreads the
//     servers' memory anew. Before the counts it right-sizes each role's processes from what
//     they were measured to use: cores to the most a process used times CPUHeadroom (more for
//     a worker that uses nearly all of its own), a worker's memory to the most one used times
//     MemoryHeadroom; a cut of cores whose measured cost in throughput is worth the cores is
//     undone. Without a prior it first explores: a worker more, then a server more, to see
//     how the job scales.
//  3. Observe answers instability at once: a server hot (CPU share at least HotCPU for HotFor)
//     gets a server added and the hottest slots moved by load (AddServer; Rebalance at
//     MaxServers); a server killed for lack of memory, or near its limit, is restarted larger
//     and restores from the flash checkpoint (RestartServer), or, at MaxServerMemory, has its
//     rows spread over more servers (AddServer; at once when it was killed); a worker whose
//     step time stays
//     StragglerFactor times the median is replaced (ReplaceWorker); a request pending longer
//     than PendingFor is made smaller (ShrinkRequest), never below what it is known to need
//     (a server's share of the rows, a worker's measured peak, with MemoryHeadroom).
//
// Every Decision carries the numbers it was made on (Value against Limit, throughput Before
// and After) and a Reason in words, and the planner logs it to Config.Logger.
//
// # On a live job
//
// A Runner drives a Planner from an elastic.Coordinator: each Tick reads Status and Usage,
// makes the Observation from the differences since the previous tick (throughput from the
// records trained, each server's CPU share from its serving time over its uptime and
// RunnerConfig.ServerCPU or the plan's cores, its table memory against the plan's server
// memory, each worker's mean batch time), and carries out the decisions: SetParallelism for a
// Resize; SetParallelism and Coordinator.Rebalance for AddServer, whose Applied.Took is the
// time from the hot server's detection to the slots moved; SetPlan with the larger size and
// RunnerConfig.RestartServer (LocalRestart for a LocalJob) for RestartServer, the coordinator
// restoring the server from the newest commit; Coordinator.Fail or RunnerConfig.ReplaceWorker
// for a straggler; SetPlan for a smaller request. Run ticks every RunnerConfig.Every until its
// context ends:
//
//	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Coordinator: job.Coordinator(), Planner: p,
//		RestartServer: autoscale.LocalRestart(job)})
//	go r.Run(ctx)
//
// # Concurrency
//
// A Planner's methods are safe for concurrent use; observations must come in time order.
// Fit, NNLS and Model's methods are pure functions. The slices of an Observation are read
// during Observe only, and a Decision shares nothing with the planner.
package autoscale
