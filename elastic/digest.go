package elastic

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/ps"
)

// Digester is a ParameterServer that digests its part of the job's model: the rows of the slots
// t gives it, in every table and dense tensor it hosts (ps.Server.Digest). Coordinator.Digest
// needs every server to be one; server.Server and remote.Server are. Detect it with a type
// assertion.
type Digester interface {
	Digest(ctx context.Context, t *ps.OwnerTable) (checkpoint.Digest, error)
}

// holdReq is a request to run fn while the job's model is held still (Coordinator.hold).
type holdReq struct {
	ctx  context.Context
	fn   func(ctx context.Context, step uint64) error
	done chan error // fn's error, or why it did not run; buffered
}

// hold runs fn at the next barrier, with every live worker waiting and no batch in hand, and
// returns its error: fn sees the model as it is at step (the steps counted then), and the
// barrier comes down when it returns. A checkpoint due goes first; a recovery under way delays
// it. fn runs on the coordinator's executor: it must not wait for anything the executor does.
func (c *Coordinator) hold(ctx context.Context, fn func(ctx context.Context, step uint64) error) error {
	req := &holdReq{ctx: ctx, fn: fn, done: make(chan error, 1)}
	c.mu.Lock()
	if err := c.superseded; err != nil || c.closed {
		c.mu.Unlock()
		return cmpOrClosed(err)
	}
	c.holdQ = append(c.holdQ, req)
	c.applyLocked(c.core.requestHold(c.clock.now()))
	c.mu.Unlock()
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err() // the executor skips fn, and releases the barrier at once
	case <-c.done:
		return ErrClosed
	}
}

func cmpOrClosed(err error) error {
	if err != nil {
		return err
	}
	return ErrClosed
}

// serveHolds carries out actHold: it runs the requests a serves, then lowers the barrier.
func (c *Coordinator) serveHolds(a action) {
	c.mu.Lock()
	n := min(a.holds, len(c.holdQ))
	reqs := slices.Clone(c.holdQ[:n])
	c.holdQ = slices.Delete(c.holdQ, 0, n)
	current := c.core.phase == phaseHeld && c.core.gen == a.gen
	c.mu.Unlock()
	for _, r := range reqs {
		switch {
		case !current:
			r.done <- errors.New("elastic: hold abandoned: the job was rolled back")
		case r.ctx.Err() != nil:
			r.done <- r.ctx.Err()
		default:
			r.done <- r.fn(r.ctx, a.step)
		}
	}
	if current {
		c.mu.Lock()
		c.applyLocked(c.core.holdDone(c.clock.now(), a.gen))
		c.mu.Unlock()
	}
}

// Digest returns the digest of the job's model (checkpoint.Digest: every embedding table and
// dense tensor on every server, bit for bit), taken at a consistent point: training is held at
// a barrier, as for a checkpoint (every worker finishes the batch in hand and waits; a checkpoint
// due goes first), so that no batch of a Session is half applied, and every server digests the
// slots one owner table gives it, with no slot handed over meanwhile. Digest.Step is the job's
// step then: a checkpoint taken at that step holds the same model, and so does the job restored
// from it (compare with DigestCommit). Pushes made outside sessions (a ps.Client of the
// program's own) are not held.
//
// It fails while a server is failed and not recovered, with errors.ErrUnsupported when a server
// is not a Digester, and with ctx's error when ctx ends first.
func (c *Coordinator) Digest(ctx context.Context) (checkpoint.Digest, error) {
	var out checkpoint.Digest
	err := c.hold(ctx, func(ctx context.Context, step uint64) error {
		c.tableMu.Lock() // one owner table for every server: no handover meanwhile
		defer c.tableMu.Unlock()
		c.mu.Lock()
		failed := c.core.failedServers()
		servers := slices.Clone(c.servers)
		c.mu.Unlock()
		if len(failed) > 0 {
			return fmt.Errorf("parameter servers %v failed and are not recovered", failed)
		}
		t := c.holder.Get()
		if err := c.syncTables(ctx, servers, t); err != nil {
			return err
		}
		parts := make([]checkpoint.Digest, len(servers))
		err := onEach(ctx, servers, func(ctx context.Context, i int, s ParameterServer) error {
			d, ok := s.(Digester)
			if !ok {
				return fmt.Errorf("server %s (%T) cannot digest its model: %w", s.Node().ID, s, errors.ErrUnsupported)
			}
			var err error
			if parts[i], err = d.Digest(ctx, t); err != nil {
				return fmt.Errorf("digest on %s: %w", s.Node().ID, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		out, err = checkpoint.Merge(parts...)
		out.Step = step
		return err
	})
	if err != nil {
		return checkpoint.Digest{}, fmt.Errorf("elastic: digest of the job: %w", err)
	}
	return out, nil
}

// DigestCommit returns the digest of the commit of step (checkpoint.Committer.Digest): the model
// a restore of it loads, onto any number of servers, read from storage. Its Step is step. It
// fails without checkpoint storage (ErrInvalidConfig), and with an error wrapping
// checkpoint.ErrNotCommitted when step has no commit.
func (c *Coordinator) DigestCommit(ctx context.Context, step uint64) (checkpoint.Digest, error) {
	if c.committer == nil {
		return checkpoint.Digest{}, fmt.Errorf("%w: no checkpoint storage", ErrInvalidConfig)
	}
	return c.committer.Digest(ctx, step)
}
