package autoscale

import (
	"context"

	"github.com/elasticps/elasticps/elastic"
)

// Signals is what the platform that runs a job's processes tells of them and the job itself
// cannot see: the processes its scheduler has not placed, and the servers its kernel killed for
// lack of memory. *kube.Scaler (package elastic/kube) is one; RunnerConfig.Signals hands it to
// a Runner, which reads it at every observation. Its methods must not block for long and are
// called from the Runner's goroutine, one at a time.
type Signals interface {
	// Plan returns the plan the processes run (elastic.Scaler.Plan): a Runner takes the counts
	// and sizes from it while the job's coordinator has none yet (elastic.Status.Plan is zero
	// until the coordinator's first SetPlan), as when a program starts its processes before
	// its coordinator.
	Plan() elastic.Plan
	// Pending lists the processes of the plan asked for and not scheduled yet, each with the
	// size it asks for and how long it has waited at that size (Observation.Pending).
	Pending() []Pending
	// OOMKills returns the parameter servers killed for going over their memory limit since the
	// previous call, each kill once, in order: the planner's ServerLoad.OOMKilled. A kill whose
	// answer fails (Tick) is handed to the next observation again by the Runner.
	OOMKills() []OOMKill
	// RestartServer makes server id run with at least the server size of the plan, which the
	// Runner has given the job's coordinator (SetPlan) first, and restore its slots from the
	// newest flash checkpoint: RunnerConfig.RestartServer. A platform that has replaced the
	// killed server larger by itself already does nothing more. An error means it did not
	// take effect.
	RestartServer(ctx context.Context, id, reason string) error
}

// OOMKill is a parameter server killed for going over its memory limit.
type OOMKill struct {
	ID string
	// MemoryLimit is the limit it went over, in bytes (0: unknown, the plan's server memory).
	MemoryLimit int64
}
