package shardtest

import (
	"context"
	"sync"
	"time"
)

// Clock is a fake clock for shard.Config.Clock. It only moves when told to.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (a negative d moves it back).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Sleeper is a fake shard.ReaderConfig.Sleep: it advances its clock (if any) by the requested
// duration at once, and records the sleeps.
type Sleeper struct {
	Clock *Clock // may be nil

	mu     sync.Mutex
	sleeps []time.Duration
}

// Sleep returns ctx.Err() if ctx is done, else advances the clock by d and returns nil.
func (s *Sleeper) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	s.sleeps = append(s.sleeps, d)
	s.mu.Unlock()
	if s.Clock != nil {
		s.Clock.Advance(d)
	}
	return nil
}

// Sleeps returns the durations slept so far.
func (s *Sleeper) Sleeps() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.sleeps...)
}
