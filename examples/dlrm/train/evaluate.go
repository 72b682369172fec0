package train

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"golang.org/x/sync/errgroup"
)

// loadCommit loads the commit Config.Evaluate names into the fresh servers: "best" is the commit
// a keep-best run pinned, "newest" the newest commit, a number that step's commit.
func (r *run) loadCommit(ctx context.Context) error {
	target, err := parseEvaluate(r.cfg.Evaluate)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	commits, err := r.commits.Commits(ctx)
	if err != nil {
		return fmt.Errorf("evaluate: %w", err)
	}
	if len(commits) == 0 {
		return fmt.Errorf("%w in %s", ErrNoCheckpoint, r.cfg.CheckpointDir)
	}
	step := target.step
	switch {
	case target.newest:
		step = commits[0].Step
	case target.best:
		pinned, ok, err := r.commits.Pinned(ctx)
		if err != nil {
			return fmt.Errorf("evaluate: %w", err)
		}
		if !ok {
			return fmt.Errorf("%w: %s has no commit marked best (a run with -keep-best marks one)", ErrNoCheckpoint, r.cfg.CheckpointDir)
		}
		step = pinned
	}
	found := false
	for _, c := range commits {
		found = found || c.Step == step
	}
	if !found {
		return fmt.Errorf("%w: %s has no commit of step %d (it has %d, the newest of step %d)", ErrNoCheckpoint, r.cfg.CheckpointDir, step, len(commits), commits[0].Step)
	}
	table, err := r.job.Coordinator().OwnerTable(ctx, 0)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, s := range r.job.Servers {
		g.Go(func() error {
			if err := s.Load(gctx, step, table); err != nil {
				return fmt.Errorf("load the commit of step %d on %s: %w", step, s.Node().ID, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		if errors.Is(err, checkpoint.ErrCorrupt) || errors.Is(err, checkpoint.ErrNotFound) {
			return fmt.Errorf("evaluate: %w", err)
		}
		return fmt.Errorf("evaluate (were the data and model settings those of the run that wrote it?): %w", err)
	}
	r.restoredStep = step
	return nil
}

// evaluate scores the loaded commit (Config.Evaluate) on the test set, and on the validation set
// when there is one, and returns the summary.
func (r *run) evaluate(ctx context.Context) (*Summary, error) {
	start := time.Now()
	s := &Summary{
		Data: r.data.desc, HeldOut: r.data.heldOut, Servers: len(r.job.Servers), Evaluated: r.restoredStep, Overlap: r.data.overlap,
		StopReason: fmt.Sprintf("evaluated the commit of step %d", r.restoredStep),
	}
	if r.eval != r.testEval {
		ev, err := r.eval.run(ctx)
		if err != nil {
			return s, err
		}
		s.Valid = &ev
		r.emit(Event{Kind: EventEval, Eval: ev})
	}
	ev, err := r.testEval.run(ctx)
	if err != nil {
		return s, err
	}
	s.Eval = ev
	r.emit(Event{Kind: EventEval, Eval: ev})
	s.Elapsed = time.Since(start)
	if err := r.writePredictions(s, r.testEval); err != nil {
		return s, err
	}
	return s, nil
}
