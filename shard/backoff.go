package shard

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Backoff shapes the waits between retries of a failed dispatcher call: Initial, then
// multiplied by Multiplier after each failure up to Max, each wait shortened by a random
// fraction up to Jitter. The zero value means the defaults.
type Backoff struct {
	Initial    time.Duration // first wait; default 50ms
	Max        time.Duration // longest wait; default 5s
	Multiplier float64       // growth per failure; default 2
	Jitter     float64       // in [0, 1): random fraction taken off each wait; default 0.2
}

func (b *Backoff) fill() {
	if b.Initial == 0 {
		b.Initial = 50 * time.Millisecond
	}
	if b.Max == 0 {
		b.Max = 5 * time.Second
	}
	if b.Multiplier == 0 {
		b.Multiplier = 2
	}
	if b.Jitter == 0 {
		b.Jitter = 0.2
	}
}

func (b Backoff) validate() []error {
	var errs []error
	if b.Initial < 0 || b.Max < 0 || b.Max < b.Initial {
		errs = append(errs, fmt.Errorf("Backoff: Initial %v and Max %v must be >= 0 with Initial <= Max", b.Initial, b.Max))
	}
	if b.Multiplier < 1 {
		errs = append(errs, fmt.Errorf("Backoff: Multiplier %v must be >= 1", b.Multiplier))
	}
	if b.Jitter < 0 || b.Jitter >= 1 {
		errs = append(errs, fmt.Errorf("Backoff: Jitter %v must be in [0, 1)", b.Jitter))
	}
	return errs
}

// wait returns the wait before retry number attempt (from 1).
func (b Backoff) wait(attempt int, r *rng) time.Duration {
	d := float64(b.Initial)
	for i := 1; i < attempt && d < float64(b.Max); i++ {
		d *= b.Multiplier
	}
	d = min(d, float64(b.Max))
	u := float64(r.next()>>11) / (1 << 53)
	return time.Duration(d * (1 - b.Jitter*u))
}

// isCtxErr reports whether err comes from a context.
func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
