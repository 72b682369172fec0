package train

import (
	"sync"
	"time"
)

// pausableClock is the dispatcher's clock: wall time that stands still while training is paused
// for a checkpoint (the gate or the barrier is closed). A lease's lifetime is meant to bound how
// long a worker takes between two reports, and a worker held at the gate cannot report, so the
// pause must not count against it: without this, a snapshot longer than the lease TTL (or a
// barrier waiting that long) would make the leases of live workers expire, and the batches
// waiting at the gate would then be applied for shards already handed to someone else.
// Safe for concurrent use; pauses may nest.
type pausableClock struct {
	mu     sync.Mutex
	now    func() time.Time
	paused time.Duration // total length of the pauses that ended
	depth  int           // pauses in progress
	since  time.Time     // start of the outermost pause in progress
}

func newPausableClock(now func() time.Time) *pausableClock {
	if now == nil {
		now = time.Now
	}
	return &pausableClock{now: now}
}

// Now returns the wall time minus every pause; during a pause, the time it began (minus the
// earlier pauses). It never goes backwards.
func (c *pausableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.depth > 0 {
		return c.since.Add(-c.paused)
	}
	return c.now().Add(-c.paused)
}

// pause stops the clock until the matching resume.
func (c *pausableClock) pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.depth == 0 {
		c.since = c.now()
	}
	c.depth++
}

// resume ends a pause.
func (c *pausableClock) resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.depth == 0 {
		return
	}
	c.depth--
	if c.depth == 0 {
		c.paused += c.now().Sub(c.since)
	}
}
