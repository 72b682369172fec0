// Package autoscale recommends a training job's resources and re-sizes it while it runs: the
// three stages of DLRover-RM (Wang et al., VLDB 2024) over the elastic coordinator, in its
// process or from another.
//
// # The model
//
// A Model predicts a job's throughput (samples per second) from its Shape: workers, parameter
// servers and the cores of each. It is the Optimus form, a worker's seconds per sample being
//
//	t = Base + WorkerCompute/cw + ServerCompute*w/(p*cs) + PerWorker*w + PerServer*p
//
// and the throughput w/t: concave and saturating in the workers, with a best number of
// servers; cw and cs are bounded by the cores a process can use (Model.WorkerCores,
// ServerCores: its threads, measured). Fit finds the non-negative coefficients that best
// explain measured Samples (NNLS, the Lawson-Hanson active-set method), with the compute and
// serve shares of the step where measured, drawn towards a Prior where the samples leave
// them open.
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
//  1. Begin: the history (LoadHistory, AppendHistory: a JSON file replaced atomically) sizes
//     the first plan. With the user's request in the profile, each process gets what the
//     earlier jobs' processes used of their users' requests: cores where a step more of
//     that spread is worth less than AddEfficiency by the history's model, a worker's memory
//     its MemoryQuantile, the servers' memory per model byte the one of least expected
//     memory-time over the job's expected run and a restore of its rows if it runs out.
//     Without a request, the nearest earlier job by model size, dataset size and batch size
//     gives the sizes and the memory per model byte. The median model of the earlier jobs
//     within HistoryMaxDistance is the prior; the plan has as many servers as the memory
//     needs and the model suggests, and as many workers as the model finds worth it.
//  2. Observe re-plans every ReplanEvery, once a shape has Settle samples (and, after a change
//     that moved rows, Cooldown has passed): it fits the model to the measurements of the
//     newest Window shapes and adds the worker or server of highest marginal efficiency
//     (throughput gained per resource over throughput per resource, a resource being a core
//     or CoreMemory of memory) while that is at least AddEfficiency and the quota allows, or
//     removes those whose loss is below RemoveEfficiency (Resize), several at once (MaxStep),
//     within the quota's counts, cores (MaxCPU) and memory (MaxMemory). Workers join and
//     leave between steps and cost nothing to change; a change of the servers moves rows
//     (servers of a new size take them all, a server added its share) and is made only when
//     the time it saves over the job's remaining samples pays Payback times the training it
//     loses while they move (MoveBytesPerSecond, MoveSpeed). Before the counts it right-sizes
//     each role's processes: where the observations report the share of the time a process
//     works (Busy), to the cores it uses while it works times BusyHeadroom, in the same
//     decision as the counts, and up by CPUHeadroom where a process uses all of its cores and
//     the model finds more worth it; otherwise to the most a process used times CPUHeadroom,
//     undoing a cut whose measured cost in throughput is worth the cores. A worker's memory is
//     sized to the most one used times MemoryHeadroom. Measured compute and serve shares fit
//     the model's terms directly, and the cores a process uses while it works bound the
//     model's cores; without them and without a prior it first explores: a worker more, then
//     a server more (when that costs at most ExploreShare of the remaining time).
//  3. Observe answers instability at once: a server hot (CPU share at least HotCPU for HotFor)
//     gets a server like the others and the hottest slots moved by load (AddServer), when a
//     server more pays; else, or at MaxServers, the slots are moved (Rebalance). A server
//     killed for lack of memory, or near its limit, is restarted larger and restores from
//     the flash checkpoint (RestartServer); when every server is near its limit the rows are
//     spread over more servers instead, which moves a share of them rather than all
//     (AddServer); at MaxServerMemory they are spread too (at once when one was killed). A
//     worker whose step time stays StragglerFactor times the median is replaced
//     (ReplaceWorker). A request pending longer than PendingFor: workers are given up first
//     (they are added back for nothing once the job runs), then requests are made smaller
//     (ShrinkRequest), never below what they are known to need (a server's share of the rows,
//     a worker's measured peak with MemoryHeadroom, the history's median cores).
//
// Every Decision carries the numbers it was made on (Value against Limit, throughput Before
// and After) and a Reason in words, and the planner logs it to Config.Logger.
//
// # On a live job
//
// A Runner drives a Planner from a running job through a Job: the three calls it makes of the
// job's coordinator (Usage, SetPlan, Rebalance), and Fail, where the Job has one, to replace a
// worker. *elastic.Coordinator is one, in the coordinator's process; *remote.Control is one from any
// other process, over the control protocol of the coordinator's RPC port (package
// elastic/remote; this package does not import it), so an autoscaler may run beside a cluster
// scheduler rather than inside the training job.
//
// Each Tick reads Usage and makes the Observation from the differences since the previous
// tick (throughput from the records trained, each server's CPU share from its serving time
// over its uptime and RunnerConfig.ServerCPU or the plan's cores, its table memory against
// the plan's server memory, each worker's mean batch time), and carries out the decisions:
// SetPlan for a Plan or a Resize; SetPlan and Rebalance for AddServer, whose Applied.Took is
// the time from the hot server's detection to the slots moved; SetPlan with the larger size
// and RunnerConfig.RestartServer (local.Job.RestartServerByID for an in-process job) for
// RestartServer, the coordinator restoring the server from the newest commit;
// RunnerConfig.ReplaceWorker, or the Job's Fail, for a straggler; SetPlan for a smaller
// request. A decision that changes the plan reads Usage first, so that the plan keeps what
// the decision does not change. Run ticks every RunnerConfig.Every until its context ends:
//
//	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: job.Coordinator(), Planner: p,
//		RestartServer: job.RestartServerByID})
//	go r.Run(ctx)
//
// or, from another process:
//
//	ctl, err := remote.NewControl(remote.Config{Addr: coordinatorAddr, Secret: secret})
//	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: ctl, Planner: p, RestartServer: restart})
//
// # Signals from the platform
//
// What the job cannot see of its own processes comes from the platform that runs them, through
// Signals (RunnerConfig.Signals; *kube.Scaler is one, and this package does not import
// client-go): the processes its scheduler has not placed (Observation.Pending, with the
// scheduler's reason, which the decision's Reason repeats), the servers its kernel killed for
// lack of memory since the previous observation (ServerLoad.OOMKilled with the limit they went
// over, also while the job counts the server failed and has no figures of it), the plan while
// the job's coordinator has none (a Kubernetes coordinator starts its pods before it exists),
// and RestartServer. So the planner acts on real signals: a server killed comes back with
// MemoryGrowth times its limit and restores its slots; a process pending longer than PendingFor
// is asked for smaller, and the platform asks again for it at that size, or given up:
//
//	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: coord, Planner: p, Signals: scaler})
//
// The platform may answer a kill itself first (kube's scaler replaces an OOM-killed pod with
// more memory at once): its RestartServer then finds the server as large as the plan asks and
// does nothing, so a kill is answered once; see package elastic/kube. A platform that fails a
// pending process by itself after a timeout must wait longer than PendingFor.
//
// # Concurrency
//
// A Planner's methods are safe for concurrent use; observations must come in time order. A
// Runner's Tick, Observe, Apply and Run are called from one goroutine at a time; the Job it
// drives must be safe for concurrent use with the job's other callers (the coordinator and
// remote.Control are). Fit, NNLS and Model's methods are pure functions. The slices of an Observation are read
// during Observe only, and a Decision shares nothing with the planner.
package autoscale
