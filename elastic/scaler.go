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

// A Scaler turns a Plan into running processes, and keeps them running: one whose process
// dies is started again (a new incarnation under the same node id), up to the scaler's restart
// limit. Implementations: LocalScaler (a LocalJob's workers as goroutines), ProcessScaler (os/exec
// of a binary with role flags); a Kubernetes scaler is planned.
//
// Servers are named ps-0 .. ps-(Servers-1) and workers worker-0 .. worker-(Workers-1); a plan
// with fewer of a role stops the highest-numbered ones. A plan's sizes apply to the processes
// started from then on (and their restarts); a running process keeps its size.
type Scaler interface {
	// Scale starts or stops processes until plan's run. It returns once every process it
	// started is launched (not necessarily serving or training yet); ctx bounds the wait.
	Scale(ctx context.Context, plan Plan) error
	// Plan returns the plan the scaler runs now.
	Plan() Plan
	// Close stops every process the scaler started and waits for them. Close is idempotent.
	Close() error
}

// CoordinatorID is the node id of a job's coordinator process.
const CoordinatorID = "coordinator"

// ServerID names the i-th parameter server of a plan.
func ServerID(i int) string { return fmt.Sprintf("ps-%d", i) }

// WorkerID names the i-th worker of a plan.
func WorkerID(i int) string { return fmt.Sprintf("worker-%d", i) }
