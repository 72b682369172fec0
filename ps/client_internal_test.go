package ps

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sendParts runs every part once, and a part that fails cancels the others only when asked to.
func TestSendPartsRunsAllAndCancels(t *testing.T) {
	for _, parallel := range []int{1, 2, 3, 8} {
		for _, n := range []int{1, 2, 5} {
			parts := make([]part, n)
			errs := make([]error, n)
			var mu sync.Mutex
			ran := map[int]int{}
			sendParts(context.Background(), parts, errs, parallel, true, func(ctx context.Context, i int) bool {
				mu.Lock()
				ran[i]++
				mu.Unlock()
				return false
			})
			for i := range parts {
				assert.Equal(t, 1, ran[i], "parallel %d, %d parts: part %d", parallel, n, i)
			}
		}
	}
	for _, cancelOnFail := range []bool{true, false} {
		// Part 0 fails; the last part, run by the caller after the others started, waits for
		// it and reports whether its context was cancelled.
		parts := make([]part, 3)
		errs := make([]error, 3)
		failed := make(chan struct{})
		var cancelled atomic.Bool
		sendParts(context.Background(), parts, errs, 8, cancelOnFail, func(ctx context.Context, i int) bool {
			switch i {
			case 0:
				defer close(failed)
				return true
			case 2:
				<-failed
				if cancelOnFail {
					select { // cancelled by the failure; the timer only bounds a failing test
					case <-ctx.Done():
					case <-time.After(10 * time.Second):
					}
				}
				cancelled.Store(ctx.Err() != nil)
			}
			return false
		})
		require.Equal(t, cancelOnFail, cancelled.Load(), "cancelOnFail %v", cancelOnFail)
	}
}
