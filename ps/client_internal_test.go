package ps

import (
	"context"
	"math/bits"
	"math/rand/v2"
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

// The dedupe table stays short-probed on ids in arithmetic progression, random ids and ids that
// are multiples of the golden-ratio constant (or of its inverse), which a multiplicative probe
// alone piles into one run of the table.
func TestDedupeProbesStayShort(t *testing.T) {
	const golden = 0x9e3779b97f4a7c15
	inv := uint64(1) // golden's inverse mod 2^64, by Newton's iteration
	for range 6 {
		inv *= 2 - golden*inv
	}
	rng := rand.New(rand.NewPCG(3, 4))
	shapes := map[string]func(j uint64) uint64{
		"dense":       func(j uint64) uint64 { return j },
		"golden":      func(j uint64) uint64 { return j * golden },
		"inverse":     func(j uint64) uint64 { return j * inv },
		"random":      func(uint64) uint64 { return rng.Uint64() },
		"stride 4096": func(j uint64) uint64 { return j << 12 },
	}
	for name, shape := range shapes {
		const n = 1 << 16
		ids := make([]uint64, n)
		for j := range ids {
			ids[j] = shape(uint64(j))
		}
		var sc clientScratch
		sc.dedupe(ids, false)
		if len(sc.uniq) != n {
			t.Fatalf("%s: %d distinct of %d", name, len(sc.uniq), n)
		}
		size := len(sc.slots)
		shift := bits.TrailingZeros(uint(size))
		worst, total := 0, 0
		for _, id := range ids {
			home := probeHash(id) >> (64 - shift)
			d := 0
			for k := home; sc.uniq[sc.slots[k]-1] != id; k = (k + 1) & uint64(size-1) {
				d++
			}
			total += d + 1
			worst = max(worst, d+1)
		}
		if avg := float64(total) / n; avg > 3 || worst > 64 {
			t.Errorf("%s: %.1f probes per id on average, %d at worst", name, avg, worst)
		}
	}
}
