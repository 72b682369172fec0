package autoscale

import (
	"fmt"
	"log/slog"
	"time"
)

// Kind is what a Decision asks for.
type Kind uint8

const (
	// Plan is a job's first shape (Planner.Begin): the counts and the sizes to start it with.
	Plan Kind = iota + 1
	// Resize changes the counts of workers and servers to Decision.Shape: a re-plan, or a step
	// to learn how the job scales.
	Resize
	// AddServer adds a parameter server because Target is hot, and then moves slots off the
	// hottest servers by their measured load (Decision.Shape has the new count).
	AddServer
	// Rebalance moves slots off the hot server Target by measured load, without a new
	// server (the job has MaxServers already).
	Rebalance
	// RestartServer restarts server Target with Decision.Size (more memory) and restores its
	// slots from the newest flash checkpoint: it was killed for lack of memory or runs near
	// its limit.
	RestartServer
	// ReplaceWorker stops the straggling worker Target and starts another in its place.
	ReplaceWorker
	// ShrinkRequest asks again for the process Target, which has waited too long to be
	// scheduled, with the smaller Decision.Size; with the request at Config.MinProcess already,
	// Decision.Shape gives up that process instead.
	ShrinkRequest
)

var kindNames = [...]string{"", "plan", "resize", "add-server", "rebalance", "restart-server", "replace-worker", "shrink-request"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Role is a process's role in a job.
type Role uint8

const (
	// Worker trains.
	Worker Role = iota + 1
	// Server is a parameter server.
	Server
)

func (r Role) String() string {
	switch r {
	case Worker:
		return "worker"
	case Server:
		return "server"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Decision is one thing the planner asks for, with the numbers it was decided on, so that a
// log line says why.
type Decision struct {
	Kind Kind
	// At is the observation's time.
	At time.Time
	// Target is the process the decision is about (a server's or worker's id); empty for the
	// whole job. Role is its role.
	Target string
	Role   Role
	// Shape is the job's shape once the decision is carried out.
	Shape Shape
	// Size is the new size of Target (RestartServer, ShrinkRequest).
	Size Resources
	// Value is the measured or predicted number the decision turned on, Limit the threshold it
	// was held against: a marginal efficiency against Config.AddEfficiency, a CPU share
	// against HotCPU, memory against the limit, a step time against the median times
	// StragglerFactor, a wait against PendingFor.
	Value, Limit float64
	// Before and After are the throughput in samples per second before the decision (measured
	// or, for a Resize, the model's at the old shape) and the model's prediction after it; zero
	// where the decision does not change the throughput.
	Before, After float64
	// Reason says it in words, with the numbers.
	Reason string
}

// String returns the kind, the target and the reason.
func (d Decision) String() string {
	if d.Target == "" {
		return fmt.Sprintf("%v: %s", d.Kind, d.Reason)
	}
	return fmt.Sprintf("%v %s: %s", d.Kind, d.Target, d.Reason)
}

// LogValue makes a Decision log as a group of its fields.
func (d Decision) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("kind", d.Kind.String())}
	if d.Target != "" {
		attrs = append(attrs, slog.String("target", d.Target))
	}
	attrs = append(attrs,
		slog.Int("workers", d.Shape.Workers), slog.Int("servers", d.Shape.Servers),
		slog.Float64("value", d.Value), slog.Float64("limit", d.Limit))
	if d.Size != (Resources{}) {
		attrs = append(attrs, slog.Float64("cpu", d.Size.CPU), slog.Int64("memory", d.Size.Memory))
	}
	if d.Before != 0 || d.After != 0 {
		attrs = append(attrs, slog.Float64("before", d.Before), slog.Float64("after", d.After))
	}
	return slog.GroupValue(append(attrs, slog.String("reason", d.Reason))...)
}
