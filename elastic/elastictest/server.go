package elastictest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/ps"
)

// Method names a method of elastic.ParameterServer that a FaultServer intercepts (every one but
// Node).
type Method uint8

const (
	MethodInstallTable Method = iota + 1
	MethodFence
	MethodSnapshot
	MethodWaitPersisted
	MethodVerify
	MethodLoad
	MethodHealth
	MethodAdmit
	MethodRestore
	MethodLead
	MethodTable
	numMethods
)

var methodNames = [numMethods]string{"", "InstallTable", "Fence", "Snapshot", "WaitPersisted", "Verify",
	"Load", "Health", "Admit", "Restore", "Lead", "Table"}

// String returns the method's name, "Fence" for MethodFence.
func (m Method) String() string {
	if m == 0 || m >= numMethods {
		return fmt.Sprintf("Method(%d)", uint8(m))
	}
	return methodNames[m]
}

// Call is one call of a ParameterServer method, as a FaultServer's rules see it. The fields a
// method has no argument for are zero.
type Call struct {
	Method Method
	// Server is the server's node id.
	Server string
	// N counts the server's calls of Method: 1 for its first.
	N int
	// Step is the step of Snapshot, WaitPersisted, Verify, Load and Restore.
	Step uint64
	// Table is the owner table of InstallTable, Verify, Load and Restore.
	Table *ps.OwnerTable
	// Mode is Restore's.
	Mode elastic.RestoreMode
	// Incarnation is the incarnation of Admit and Lead.
	Incarnation uint64
	// Floor and Epochs are Fence's; Epochs belongs to the caller (read it, do not keep it).
	Floor  uint64
	Epochs []uint64
}

// Rule says what a FaultServer does with the calls it applies to. A rule applies to the calls of
// Method that Match accepts, once Skip of them have passed, and to at most Times of them. The
// call is counted (Fault.Hits), waits for Hold, then fails with Err or, with Err nil, goes on to
// the server.
type Rule struct {
	// Method is the method the rule is about. Zero: every method (a server that hangs, say).
	Method Method
	// Match, if set, selects the calls the rule applies to; it must not block. Nil: every call
	// of Method.
	Match func(Call) bool
	// Skip lets the first Skip calls the rule matches pass untouched.
	Skip int
	// Times is how many calls the rule applies to after those skipped. Default 0: every one.
	Times int
	// Hold, if set, makes the call wait until it is closed (or the call's context ends: the call
	// fails with the context's error). Admit, which has no context, waits for Hold alone.
	Hold <-chan struct{}
	// Err, if set, is the error the call fails with, without reaching the server (Admit, which
	// returns nothing, is not passed on either). Nil: the call goes on to the server.
	Err error
}

// Fault is a Rule injected into a FaultServer: it tells which calls the rule applied to.
type Fault struct {
	rule    Rule
	matched int // calls the rule matched, skipped ones included; guarded by the server's mu

	mu      sync.Mutex
	hits    []Call
	changed chan struct{} // closed and replaced at each hit
}

// Hits returns the calls the rule applied to so far, in order (a held call is among them).
func (f *Fault) Hits() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.hits)
}

// Wait waits until the rule has applied to n calls, and returns the n-th (1 is the first). A
// call held by the rule counts as soon as it arrives: Wait tells that the call is held.
func (f *Fault) Wait(ctx context.Context, n int) (Call, error) {
	for {
		f.mu.Lock()
		if len(f.hits) >= n {
			c := f.hits[n-1]
			f.mu.Unlock()
			return c, nil
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return Call{}, ctx.Err()
		}
	}
}

func (f *Fault) hit(c Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hits = append(f.hits, c)
	close(f.changed)
	f.changed = make(chan struct{})
}

// FaultServer is an elastic.ParameterServer that passes every call to the server it wraps,
// but for the calls its rules (Inject) fail, hold or count. It counts every call by method. The
// first rule injected that applies to a call decides it; rules injected later do not see it.
// Everything it does is decided by the calls it gets, in their order: no randomness, no clock.
// Safe for concurrent use.
type FaultServer struct {
	elastic.ParameterServer

	mu     sync.Mutex
	counts [numMethods]int
	rules  []*Fault
}

var _ elastic.ParameterServer = (*FaultServer)(nil)

// NewFaultServer wraps s, with no rule yet.
func NewFaultServer(s elastic.ParameterServer) *FaultServer {
	return &FaultServer{ParameterServer: s}
}

// Inject adds r after the server's other rules and returns it as a Fault.
func (s *FaultServer) Inject(r Rule) *Fault {
	f := &Fault{rule: r, changed: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = append(s.rules, f)
	return f
}

// Remove takes f out of the server's rules: calls from then on do not see it (one it holds
// waits on).
func (s *FaultServer) Remove(f *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = slices.DeleteFunc(s.rules, func(g *Fault) bool { return g == f })
}

// Clear removes every rule.
func (s *FaultServer) Clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = nil
}

// Count returns how many calls of m the server has had, those its rules failed included.
func (s *FaultServer) Count(m Method) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[m]
}

// Unwrap returns the wrapped server.
func (s *FaultServer) Unwrap() elastic.ParameterServer { return s.ParameterServer }

// intercept counts c and runs the rule that applies to it, if any: it returns whether the call
// goes on to the server, and the error it fails with otherwise.
func (s *FaultServer) intercept(ctx context.Context, c Call) (bool, error) {
	c.Server = s.Node().ID
	s.mu.Lock()
	s.counts[c.Method]++
	c.N = s.counts[c.Method]
	var rule *Fault
	for _, f := range s.rules {
		r := f.rule
		if (r.Method != 0 && r.Method != c.Method) || (r.Match != nil && !r.Match(c)) {
			continue
		}
		f.matched++
		if f.matched > r.Skip && (r.Times == 0 || f.matched <= r.Skip+r.Times) {
			rule = f
			break
		}
	}
	s.mu.Unlock()
	if rule == nil {
		return true, nil
	}
	rule.hit(c)
	if rule.rule.Hold != nil {
		var done <-chan struct{}
		if ctx != nil {
			done = ctx.Done()
		}
		select {
		case <-rule.rule.Hold:
		case <-done:
			return false, ctx.Err()
		}
	}
	if rule.rule.Err != nil {
		return false, rule.rule.Err
	}
	return true, nil
}

// InstallTable implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) InstallTable(ctx context.Context, t *ps.OwnerTable) error {
	if ok, err := s.intercept(ctx, Call{Method: MethodInstallTable, Table: t}); !ok {
		return err
	}
	return s.ParameterServer.InstallTable(ctx, t)
}

// Fence implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) Fence(ctx context.Context, floor uint64, epochs []uint64) error {
	if ok, err := s.intercept(ctx, Call{Method: MethodFence, Floor: floor, Epochs: epochs}); !ok {
		return err
	}
	return s.ParameterServer.Fence(ctx, floor, epochs)
}

// Snapshot implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) Snapshot(ctx context.Context, step uint64, committed, accepted elastic.Progress) (checkpoint.SnapshotInfo, error) {
	if ok, err := s.intercept(ctx, Call{Method: MethodSnapshot, Step: step}); !ok {
		return checkpoint.SnapshotInfo{}, err
	}
	return s.ParameterServer.Snapshot(ctx, step, committed, accepted)
}

// WaitPersisted implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) WaitPersisted(ctx context.Context, step uint64) (checkpoint.ManifestRef, error) {
	if ok, err := s.intercept(ctx, Call{Method: MethodWaitPersisted, Step: step}); !ok {
		return checkpoint.ManifestRef{}, err
	}
	return s.ParameterServer.WaitPersisted(ctx, step)
}

// Verify implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) Verify(ctx context.Context, step uint64, t *ps.OwnerTable) error {
	if ok, err := s.intercept(ctx, Call{Method: MethodVerify, Step: step, Table: t}); !ok {
		return err
	}
	return s.ParameterServer.Verify(ctx, step, t)
}

// Load implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) Load(ctx context.Context, step uint64, t *ps.OwnerTable) error {
	if ok, err := s.intercept(ctx, Call{Method: MethodLoad, Step: step, Table: t}); !ok {
		return err
	}
	return s.ParameterServer.Load(ctx, step, t)
}

// Health implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) Health(ctx context.Context) (elastic.ServerHealth, error) {
	if ok, err := s.intercept(ctx, Call{Method: MethodHealth}); !ok {
		return elastic.ServerHealth{}, err
	}
	return s.ParameterServer.Health(ctx)
}

// Admit implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) Admit(inc uint64) {
	if ok, _ := s.intercept(nil, Call{Method: MethodAdmit, Incarnation: inc}); !ok {
		return
	}
	s.ParameterServer.Admit(inc)
}

// Restore implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) Restore(ctx context.Context, step uint64, t *ps.OwnerTable, mode elastic.RestoreMode) error {
	if ok, err := s.intercept(ctx, Call{Method: MethodRestore, Step: step, Table: t, Mode: mode}); !ok {
		return err
	}
	return s.ParameterServer.Restore(ctx, step, t, mode)
}

// Lead implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) Lead(ctx context.Context, inc uint64) error {
	if ok, err := s.intercept(ctx, Call{Method: MethodLead, Incarnation: inc}); !ok {
		return err
	}
	return s.ParameterServer.Lead(ctx, inc)
}

// Table implements elastic.ParameterServer under the server's rules.
func (s *FaultServer) Table(ctx context.Context) (*ps.OwnerTable, error) {
	if ok, err := s.intercept(ctx, Call{Method: MethodTable}); !ok {
		return nil, err
	}
	return s.ParameterServer.Table(ctx)
}

var _ elastic.Digester = (*FaultServer)(nil)

// Digest implements elastic.Digester when the wrapped server does, and otherwise fails with
// errors.ErrUnsupported; no rule applies to it.
func (s *FaultServer) Digest(ctx context.Context, t *ps.OwnerTable) (checkpoint.Digest, error) {
	d, ok := s.ParameterServer.(elastic.Digester)
	if !ok {
		return checkpoint.Digest{}, fmt.Errorf("elastictest: %T cannot digest: %w", s.ParameterServer, errors.ErrUnsupported)
	}
	return d.Digest(ctx, t)
}
