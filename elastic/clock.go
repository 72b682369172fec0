package elastic

import (
	"sync"
	"time"
)

// pausableClock is the dispatcher's clock: wall time that stands still while training is paused
// at a checkpoint barrier. A lease's lifetime bounds how long a worker takes between two
// reports, and a worker held at the barrier cannot report, so the pause must not count against
// it: otherwise a barrier or a snapshot longer than the lease TTL would expire the leases of
// live workers. Safe for concurrent use; pauses may nest.
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

// resume ends a pause; an unmatched resume does nothing.
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

// reset ends every pause in progress (a barrier a rollback abandoned).
func (c *pausableClock) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.depth > 0 {
		c.paused += c.now().Sub(c.since)
		c.depth = 0
	}
}
