package elastic

import (
	"context"
	"fmt"
)

// Plan is how many processes of each role a job runs, and of what size.
type Plan struct {
	// Servers is the number of parameter servers.
	Servers int `json:"servers"`
	// Workers is the number of workers.
	Workers int `json:"workers"`
	// Server and Worker are the size of each server and worker process; zero fields: not
	// set (the scaler's or the machine's default).
	Server Resources `json:"server,omitzero"`
	Worker Resources `json:"worker,omitzero"`
}

// Resources is the size of a process.
type Resources struct {
	// CPUs is the number of cores it may use (a fraction rounds up where only whole cores
	// can be given).
	CPUs float64 `json:"cpus,omitempty"`
	// Memory is the bytes of memory it may use.
	Memory int64 `json:"memory,omitempty"`
}

// String returns "2 servers, 4 workers", with the sizes set: "2 servers (4 CPUs, 8.0 GiB), ...".
func (p Plan) String() string {
	return fmt.Sprintf("%d servers%s, %d workers%s", p.Servers, p.Server.suffix(), p.Workers, p.Worker.suffix())
}

func (r Resources) suffix() string {
	switch {
	case r == Resources{}:
		return ""
	case r.Memory == 0:
		return fmt.Sprintf(" (%g CPUs)", r.CPUs)
	case r.CPUs == 0:
		return fmt.Sprintf(" (%.1f GiB)", float64(r.Memory)/(1<<30))
	}
	return fmt.Sprintf(" (%g CPUs, %.1f GiB)", r.CPUs, float64(r.Memory)/(1<<30))
}

// Validate reports a plan with negative counts or sizes (ErrInvalidConfig).
func (p Plan) Validate() error {
	if p.Servers < 0 || p.Workers < 0 || p.Server.CPUs < 0 || p.Server.Memory < 0 || p.Worker.CPUs < 0 || p.Worker.Memory < 0 {
		return fmt.Errorf("%w: plan %+v", ErrInvalidConfig, p)
	}
	return nil
}

// A Scaler turns a Plan into running processes, and keeps them running. Implementations:
// local.Scaler (an in-process job's workers as goroutines), process.Scaler (os/exec of a
// binary with role flags) and kube.Scaler (Kubernetes pods). elastictest.TestScaler checks an
// implementation against the contract below.
//
// Servers are named ps-0 .. ps-(n-1) and workers worker-0 .. worker-(m-1).
//
// Workers: Scale sets their number. It starts worker-i for every i below plan.Workers that it
// does not run (a name whose earlier process the scaler stopped gets a new process; one that
// ended by itself, its data done or its restarts used up, is not started again), and stops the
// workers numbered plan.Workers and above. A worker stopped by its scaler leaves cleanly (its
// session leaves; its shards go back to the dispatcher at their reported offsets) and is never
// restarted.
//
// Servers: Scale never starts or stops one. The scaler's server count is the job's when the
// scaler is made for a job whose servers run already (local.Scaler), or is set by its first
// Scale when the scaler starts them itself (process.Scaler); from then on it changes only
// through a ServerScaler's StartServers and StopServers, which the coordinator calls around a
// live repartition before it hands Scale the plan with the new count (Coordinator.SetPlan). A
// Scale whose plan.Servers differs from Plan().Servers, or whose plan is not valid
// (Plan.Validate), is refused with an error wrapping ErrInvalidConfig and changes nothing.
//
// Restarts: a process the scaler runs that dies (a crash, an abnormal exit) is started again
// under its node id, as a new incarnation, up to the scaler's restart limit. Each
// implementation says which roles it restarts.
//
// A plan's sizes apply to the processes started from then on (and their restarts); a running
// process keeps its size.
type Scaler interface {
	// Scale starts and stops workers until plan's run, as the Scaler contract says. It returns
	// once every process it started is launched (not necessarily serving or training yet) and
	// every process it stopped has ended; ctx bounds the wait (the stops go on). It fails with
	// an error wrapping ErrClosed after Close.
	Scale(ctx context.Context, plan Plan) error
	// Plan returns the plan the scaler runs now: the workers and sizes of the last Scale that
	// succeeded, and the servers it runs (StartServers and StopServers change their number).
	Plan() Plan
	// Close stops every worker the scaler runs (each leaves cleanly), and the servers it
	// started itself, and waits for them. Close is idempotent.
	Close() error
}

// CoordinatorID is the node id of a job's coordinator process.
const CoordinatorID = "coordinator"

// ServerID names the i-th parameter server of a plan.
func ServerID(i int) string { return fmt.Sprintf("ps-%d", i) }

// WorkerID names the i-th worker of a plan.
func WorkerID(i int) string { return fmt.Sprintf("worker-%d", i) }
