// Package wait holds the one way the project's packages pause: for a time, or until their
// context ends, whichever comes first.
package wait

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx is done, and returns ctx's error in that case. A d of zero or
// less returns at once (ctx's error, if it is done).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
