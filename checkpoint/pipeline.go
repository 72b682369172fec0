package checkpoint

import (
	"context"
	"sync"
)

// pipeline fetches items 0..n-1 with up to workers goroutines, keeping at most workers+1 fetched but
// not yet applied, and applies them in order on the calling goroutine. After an error it stops
// fetching, releases what was fetched and returns the first error; every goroutine has ended when
// it returns. When ctx ends, the items not yet fetched fail with ctx's error, so it returns as soon
// as the fetches under way (which are given ctx) do.
//
// An item holds one of workers+1 slots from just before its fetch starts until the calling
// goroutine is done with its result (applied or dropped); an item failed for want of a fetch (ctx
// ended first) holds none, so only the result of a fetch gives a slot back.
func pipeline[T any](ctx context.Context, n, workers int, fetch func(ctx context.Context, i int) (T, error),
	apply func(i int, v T) error, release func(T)) error {
	if n == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		v       T
		err     error
		fetched bool // fetch ran: the item holds a slot
	}
	results := make([]chan result, n)
	for i := range results {
		results[i] = make(chan result, 1)
	}
	slots := make(chan struct{}, workers+1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // spawner
		defer wg.Done()
		for i := range n {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				for j := i; j < n; j++ {
					results[j] <- result{err: ctx.Err()}
				}
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := fetch(ctx, i)
				results[i] <- result{v, err, true}
			}()
		}
	}()
	var err error
	i := 0
	for ; i < n && err == nil; i++ {
		r := <-results[i]
		if r.err != nil {
			err = r.err
		} else {
			err = apply(i, r.v)
			if release != nil {
				release(r.v)
			}
		}
		if r.fetched {
			<-slots
		}
	}
	cancel()
	for ; i < n; i++ {
		r := <-results[i]
		if r.fetched {
			<-slots
		}
		if r.err == nil && release != nil {
			release(r.v)
		}
	}
	wg.Wait()
	return err
}
