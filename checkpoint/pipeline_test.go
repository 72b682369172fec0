package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// The loader's pipeline returns, with every goroutine ended and every fetched item released once,
// whatever fails or is cancelled at whichever item. It runs in a synctest bubble: a goroutine left
// blocked (on a slot, a result or a fetch) is a deadlock the bubble reports, instead of a hang.
func TestPipelineEndsAtAnErrorOrCancellationAtEveryItem(t *testing.T) {
	const n = 7
	errFetch, errApply := errors.New("fetch failed"), errors.New("apply failed")
	type mode struct {
		name string
		// fetch and apply return the item's fate; cancel cancels the pipeline's context.
		fetch func(ctx context.Context, i, at int, cancel func()) error
		apply func(i, at int, cancel func()) error
		// stuck: fetches from at on wait for ctx, which the test cancels once every goroutine
		// waits (a read of slow storage when the program is stopped).
		stuck bool
		// want says the error wanted and which items must have been applied (a prefix).
		want func(at int) (err error, applied int)
	}
	modes := []mode{
		{name: "fetch fails",
			fetch: func(_ context.Context, i, at int, _ func()) error { return errIf(i == at, errFetch) },
			want:  func(at int) (error, int) { return errFetch, at }},
		{name: "apply fails",
			apply: func(i, at int, _ func()) error { return errIf(i == at, errApply) },
			want:  func(at int) (error, int) { return errApply, at + 1 }},
		{name: "cancelled in a fetch",
			fetch: func(ctx context.Context, i, at int, cancel func()) error {
				if i == at {
					cancel()
				}
				return ctx.Err()
			},
			want: func(at int) (error, int) { return context.Canceled, -1 }},
		{name: "cancelled in an apply",
			// Every goroutine reacts to the cancellation before the apply returns: the loader
			// that waits for the items already fetched finds the next ones failed unfetched.
			apply: func(i, at int, cancel func()) error {
				if i == at {
					cancel()
					synctest.Wait()
				}
				return nil
			},
			want: func(at int) (error, int) { return context.Canceled, -1 }},
		{name: "cancelled while fetches wait", stuck: true,
			want: func(at int) (error, int) { return context.Canceled, at }},
	}
	for _, workers := range []int{1, 2, 4} {
		for _, m := range modes {
			for at := range n {
				t.Run(fmt.Sprintf("workers=%d/%s/at=%d", workers, m.name, at), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						ctx, cancel := context.WithCancel(context.Background())
						defer cancel()
						var mu sync.Mutex
						fetched := make([]int, n)  // successful fetches of each item
						released := make([]int, n) // releases of each item
						var applied []int
						outstanding, most := 0, 0 // fetched, not yet released
						fetch := func(ctx context.Context, i int) (int, error) {
							var err error
							switch {
							case m.stuck && i >= at:
								<-ctx.Done()
								err = ctx.Err()
							case m.fetch != nil:
								err = m.fetch(ctx, i, at, cancel)
							}
							if err != nil {
								return 0, err
							}
							mu.Lock()
							fetched[i]++
							outstanding++
							most = max(most, outstanding)
							mu.Unlock()
							return i, nil
						}
						apply := func(i, v int) error {
							assert.Equal(t, i, v)
							applied = append(applied, i)
							if m.apply != nil {
								return m.apply(i, at, cancel)
							}
							return nil
						}
						release := func(v int) {
							mu.Lock()
							released[v]++
							outstanding--
							mu.Unlock()
						}
						start := time.Now()
						var err error
						done := make(chan struct{})
						go func() {
							defer close(done)
							err = pipeline(ctx, n, workers, fetch, apply, release)
						}()
						if m.stuck {
							synctest.Wait() // every goroutine waits: the loader for item at
							cancel()
						}
						<-done
						assert.Zero(t, time.Since(start), "returns without waiting for time to pass")

						wantErr, wantApplied := m.want(at)
						switch {
						case wantApplied >= 0:
							assert.ErrorIs(t, err, wantErr)
							assert.Len(t, applied, wantApplied, "items applied")
						case len(applied) == n: // cancelled after the last item was fetched
							assert.NoError(t, err)
						default:
							assert.ErrorIs(t, err, wantErr)
						}
						for k, i := range applied {
							assert.Equal(t, k, i, "applied in order")
						}
						mu.Lock()
						defer mu.Unlock()
						assert.Equal(t, fetched, released, "every item fetched is released once")
						assert.LessOrEqual(t, most, workers+1, "items fetched and not yet applied")
					})
				})
			}
		}
	}
	t.Run("cancelled before it starts", func(t *testing.T) {
		for _, workers := range []int{1, 2, 4} {
			for range 20 { // the fetches and the cancellation race: try many orders
				synctest.Test(t, func(t *testing.T) {
					ctx, cancel := context.WithCancel(context.Background())
					cancel()
					var mu sync.Mutex
					fetches, releases := 0, 0
					err := pipeline(ctx, n, workers, func(ctx context.Context, i int) (int, error) {
						if err := ctx.Err(); err != nil {
							return 0, err
						}
						mu.Lock()
						fetches++
						mu.Unlock()
						return i, nil
					}, func(int, int) error { return nil }, func(int) {
						mu.Lock()
						releases++
						mu.Unlock()
					})
					assert.ErrorIs(t, err, context.Canceled)
					assert.Zero(t, fetches)
					assert.Zero(t, releases)
				})
			}
		}
	})
}

func errIf(cond bool, err error) error {
	if cond {
		return err
	}
	return nil
}
