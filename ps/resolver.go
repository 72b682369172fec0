package ps

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// Resolver supplies owner tables to clients.
type Resolver interface {
	// OwnerTable returns the newest owner table it has; callers that were refused by a server
	// with version minVersion ask for at least that, and a resolver that has nothing newer
	// returns what it has (the client gives up after its retries).
	OwnerTable(ctx context.Context, minVersion uint64) (*OwnerTable, error)
}

// UnreachableReporter is a Resolver that wants to hear of the servers a client could not reach
// at all (before the client waits for a newer owner table): a coordinator can confirm the
// failure and recover at once rather than after its own timeout. Unreachable must not block
// for long; the client ignores what it does.
type UnreachableReporter interface {
	Unreachable(ctx context.Context, server string, err error)
}

// TableHolder is a Resolver holding a table set from outside (by a coordinator or a test).
// The zero value holds nothing. Safe for concurrent use.
type TableHolder struct {
	p atomic.Pointer[OwnerTable]
}

var _ Resolver = (*TableHolder)(nil)

// Set stores t unless a newer table is held; it reports whether t was stored.
func (h *TableHolder) Set(t *OwnerTable) bool {
	for {
		cur := h.p.Load()
		if cur != nil && cur.Version > t.Version {
			return false
		}
		if h.p.CompareAndSwap(cur, t) {
			return true
		}
	}
}

// Get returns the held table, or nil.
func (h *TableHolder) Get() *OwnerTable { return h.p.Load() }

// OwnerTable returns the held table.
func (h *TableHolder) OwnerTable(ctx context.Context, minVersion uint64) (*OwnerTable, error) {
	if t := h.p.Load(); t != nil {
		return t, nil
	}
	return nil, ErrNoTable
}

// serversResolver asks servers for their tables and takes the newest.
type serversResolver struct {
	c     *Client
	addrs []string
}

func (r *serversResolver) OwnerTable(ctx context.Context, minVersion uint64) (*OwnerTable, error) {
	var best *OwnerTable
	var errs []error
	for _, a := range r.addrs {
		resp, err := r.c.rpc.Call(ctx, a, methodTable, nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			continue
		}
		if len(resp) == 0 {
			r.c.rpc.Release(resp)
			continue
		}
		t, _, err := DecodeOwnerTable(resp)
		r.c.rpc.Release(resp)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			continue
		}
		if best == nil || t.Version > best.Version {
			best = t
		}
		if best.Version >= minVersion && minVersion > 0 {
			break
		}
	}
	if best == nil && len(errs) == 0 {
		return nil, fmt.Errorf("%w: none of %d servers has one yet", ErrNoTable, len(r.addrs))
	}
	if best == nil {
		return nil, fmt.Errorf("%w: %w", ErrNoTable, errors.Join(errs...))
	}
	return best, nil
}
