package ps

import (
	"context"
	"fmt"

	"github.com/elasticps/elasticps/embedding"
)

// InitDense gives the dense tensor name its initial values, once: the first call for a tensor
// initialises it, and later ones (other workers', or any after a restore) change nothing, so
// they pull what the first gave. A tensor the servers declare (TableSpec.Dense) keeps its
// declared optimizer, and opt is ignored; one declared with its initial value
// (TableSpec.Initial) holds it from the start and needs no InitDense. An undeclared one is
// created by the first call, with opt, and is not checkpointed; servers whose tables are fixed
// (ServerConfig.DeclaredIn: those of local.Start) refuse it with ErrUnknownTable, naming the
// field to declare it in. A call whose len(values) differs from the tensor's size fails with
// ErrBadRequest.
func (c *Client) InitDense(ctx context.Context, name string, values []float32, opt embedding.Optimizer) error {
	if len(values) == 0 {
		return fmt.Errorf("%w: dense %q has no values", ErrBadRequest, name)
	}
	if i := embedding.FirstNonFinite(values); i >= 0 {
		return fmt.Errorf("%w: dense %q value %d is %v", ErrBadRequest, name, i, values[i])
	}
	return c.dense(ctx, name, func(ctx context.Context, t *OwnerTable, addr string) error {
		req := appendTableReq(nil, &tableReq{version: t.Version, table: name}, nil, nil, len(values))
		req = appendOptimizer(req, opt)
		req = appendFloats(req, values)
		resp, err := c.rpc.Call(ctx, addr, methodInitDense, req)
		c.rpc.Release(resp)
		return err
	}, false)
}

// PullDense fills dst with the dense tensor name (len(dst) must be its length).
func (c *Client) PullDense(ctx context.Context, name string, dst []float32) error {
	return c.dense(ctx, name, func(ctx context.Context, t *OwnerTable, addr string) error {
		req := appendTableReq(nil, &tableReq{version: t.Version, table: name}, nil, nil, len(dst))
		resp, err := c.rpc.Call(ctx, addr, methodPullDense, req)
		if err != nil {
			return err
		}
		defer c.rpc.Release(resp)
		if len(resp) != 4*len(dst) {
			return fmt.Errorf("%w: dense answer of %d bytes for %d values", ErrBadRequest, len(resp), len(dst))
		}
		getFloats(dst, resp)
		return nil
	}, true)
}

// PushDense applies one optimizer step to the dense tensor name with gradients grads, with the
// client's fence epoch; a push marked with its batch's position (At) is applied at most once,
// and resent after a lost connection.
func (c *Client) PushDense(ctx context.Context, name string, grads []float32, step uint64, opts ...PushOption) error {
	if i := embedding.FirstNonFinite(grads); i >= 0 {
		return fmt.Errorf("push dense %q: %w: gradient %d is %v", name, ErrNonFinite, i, grads[i])
	}
	var o pushOpts
	for _, opt := range opts {
		opt(&o)
	}
	if o.hasPos && !o.pos.valid() {
		return fmt.Errorf("push dense %q: %w: position %v", name, ErrBadRequest, o.pos)
	}
	hdr := tableReq{step: step, epoch: c.epoch.Load(), worker: uint32(c.cfg.Worker), table: name}
	if o.hasPos {
		hdr.pos, hdr.flags = o.pos, flagPosition
	}
	return c.dense(ctx, name, func(ctx context.Context, t *OwnerTable, addr string) error {
		h := hdr
		h.version = t.Version
		req := appendTableReq(nil, &h, nil, grads, len(grads))
		resp, err := c.rpc.Call(ctx, addr, methodPushDense, req)
		c.rpc.Release(resp)
		return err
	}, o.hasPos && !c.cfg.Sync)
}

// dense sends one call to the owner of name's slot, refreshing the owner table and retrying when
// refused or (for idempotent calls, and calls the server never processed) unreachable.
func (c *Client) dense(ctx context.Context, name string, call func(ctx context.Context, t *OwnerTable, addr string) error, idempotent bool) error {
	if c.closed.Load() {
		return ErrClosed
	}
	t, err := c.OwnerTable(ctx)
	if err != nil {
		return err
	}
	backoff := c.cfg.RetryBackoff
	fence := fenceWait{budget: c.cfg.FenceWait}
	for attempt := 0; ; {
		addr := t.Owner(t.NameSlot(name)).Addr
		err := call(ctx, t, addr)
		if err == nil {
			return nil
		}
		refused := mapErr(addr, err)
		maxVer := announcedVersion(refused)
		behind := serverBehind([]error{refused}, t.Version)
		waiting := (maxVer > t.Version || behind) && fence.spent < fence.budget
		if !retryable(refused, idempotent) || (!waiting && attempt+1 >= c.cfg.Retries) || ctx.Err() != nil {
			return fmt.Errorf("dense %q: %w", name, refused)
		}
		prev := t.Version
		if t, err = c.nextTable(ctx, t, maxVer, behind, &backoff, &fence); err != nil {
			return err
		}
		if t.Version <= prev && !waiting {
			if attempt++; attempt >= c.cfg.Retries {
				return fmt.Errorf("dense %q: %w", name, refused)
			}
		}
	}
}
