package checkpoint

import (
	"context"
	"sync"
)

// CopyGate holds the background work of Checkpointers back while any of them copies for a
// Snapshot. Share one among the Checkpointers of one process (the servers of an embedded job):
// without it, the server whose copy ended first seals, persists and grows its shared memory on
// the cores the other servers' blocking copies need, and training waits for the slowest copy
// (measured on two vCPUs with two servers: one copy took 5-15 ms, the other 45-50 ms, until the
// first's background work was held back). Background work waits before each piece it checksums,
// each chunk it writes and each extent it adds, so a copy that starts while it runs waits for at
// most one such step. The zero value is ready to use and safe for concurrent use.
type CopyGate struct {
	mu     sync.Mutex
	copies int           // copies in progress
	open   chan struct{} // closed when the last copy ends; nil while none runs
}

// NewCopyGate returns a gate to share among Checkpointers (Config.Gate).
func NewCopyGate() *CopyGate { return &CopyGate{} }

// enter marks a copy as started.
func (g *CopyGate) enter() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.copies == 0 {
		g.open = make(chan struct{})
	}
	g.copies++
}

// leave marks a copy as ended.
func (g *CopyGate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.copies--
	if g.copies == 0 {
		close(g.open)
		g.open = nil
	}
}

// wait returns once no copy is in progress, or with ctx's error when ctx ends first.
func (g *CopyGate) wait(ctx context.Context) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	if open == nil {
		return nil
	}
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
