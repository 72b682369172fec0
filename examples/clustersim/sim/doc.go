// Package sim is a deterministic, trace-driven simulator of a shared cluster (nodes with CPU
// cores, memory and GPUs) on which training jobs arrive, wait, run, change size, run out of
// memory and finish, under a scheduling policy.
//
// A Workload is built from the public traces under ../shared/data/traces (LoadTraces):
// PSWorkload makes parameter-server (DLRM) jobs of the Philly trace's arrivals, sizes and
// durations with the requests of Alibaba's DLRM trace; GavelWorkload makes GPU jobs of a
// Gavel trace with Gavel's measured throughputs; PolluxWorkload makes batch-elastic GPU jobs of
// a Pollux workload with Pollux's measured step times. Where the traces say nothing (what a
// job uses of what it asked for, how fast a parameter-server job trains), PSTruth models it.
//
// Run simulates one Policy on one Workload in ticks: at each tick the policy sees the State
// (waiting and running jobs, free resources, observations) and starts, resizes or preempts
// jobs through it; the engine places every process on a node (first fit), charges each change
// the ScaleCost's stall, trains each running job at its true speed, kills a job whose server
// outgrows its memory, and keeps the books (completion times, resources allocated and used).
// The policies are FIFO (the users' configurations), Auto (DLRover-RM-style auto configuration
// on package elastic/autoscale), LAS (Tiresias, and elastic), ProgressAware and
// TerminationRealloc (SC20 and its baselines) and DPScaler (Saxena et al. and their baseline).
// RunComparisons runs the four comparisons and Table renders them beside the published figures.
//
// Everything is seeded: the same traces, Setup and seed give the same table. A State is used
// by one goroutine, during its policy's Schedule; separate runs share nothing but the read-only
// Workload and Traces, so they may run concurrently.
package sim
