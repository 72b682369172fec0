package elastic

import (
	"context"
	"fmt"
)

// Plan is how many processes of each role a job runs.
type Plan struct {
	// Servers is the number of parameter servers.
	Servers int
	// Workers is the number of workers.
	Workers int
}

// String returns "2 servers, 4 workers".
func (p Plan) String() string { return fmt.Sprintf("%d servers, %d workers", p.Servers, p.Workers) }

// A Scaler turns a Plan into running processes, and keeps them running: one whose process
// dies is started again (a new incarnation under the same node id), up to the scaler's restart
// limit. Implementations: LocalJob's in-process workers, ProcessScaler (os/exec of a binary with
// role flags); Kubernetes comes with its own package.
//
// Servers are named ps-0 .. ps-(Servers-1) and workers worker-0 .. worker-(Workers-1); a plan
// with fewer of a role stops the highest-numbered ones.
type Scaler interface {
	// Scale starts or stops processes until plan's run. It returns once every process it
	// started is launched (not necessarily serving or training yet); ctx bounds the wait.
	Scale(ctx context.Context, plan Plan) error
	// Plan returns the plan the scaler runs now.
	Plan() Plan
	// Close stops every process the scaler started and waits for them. Close is idempotent.
	Close() error
}

// ServerID names the i-th parameter server of a plan.
func ServerID(i int) string { return fmt.Sprintf("ps-%d", i) }

// WorkerID names the i-th worker of a plan.
func WorkerID(i int) string { return fmt.Sprintf("worker-%d", i) }
