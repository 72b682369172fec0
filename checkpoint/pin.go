package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Pinning. A program may ask retention to spare one commit beyond its policy — the commit with
// the best validation figures of a run that keeps the best, say — with Committer.Pin: the step
// is recorded in storage (JOB/pinned), and every Prune and Clean keeps that commit and what it
// needs (its base and the deltas between) for as long as it stays pinned, whatever KeepLast is
// and whichever coordinator prunes. One commit is pinned at a time: Pin replaces the pin, Unpin
// removes it, and the commit it named then goes the way retention sends it. The pin is applied
// after the normal policy (the newest KeepLast, every KeepEvery-th, the fallback), so it never
// stands in for the fallback.

func pinName(job string) string { return job + "/pinned" }

// maxPin bounds the pin object read (a step and a newline).
const maxPin = 64

// Pin asks retention to keep the commit of step, and what it needs, until another Pin or Unpin.
// The commit need not exist yet; retention keeps it once it does and while it is valid.
func (m *Committer) Pin(ctx context.Context, step uint64) error {
	if err := putObject(ctx, m.cfg.Storage, pinName(m.cfg.Job), []byte(stepName(step)+"\n")); err != nil {
		return fmt.Errorf("checkpoint: pin step %d: %w", step, err)
	}
	return nil
}

// Unpin removes the pin, if any.
func (m *Committer) Unpin(ctx context.Context) error {
	if err := m.cfg.Storage.Delete(ctx, pinName(m.cfg.Job)); err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("checkpoint: unpin: %w", err)
	}
	return nil
}

// Pinned returns the pinned step; ok is false when there is none. An unreadable pin is an error
// wrapping ErrCorrupt.
func (m *Committer) Pinned(ctx context.Context) (step uint64, ok bool, err error) {
	b, err := getObject(ctx, m.cfg.Storage, pinName(m.cfg.Job), nil, -1, maxPin)
	if errors.Is(err, ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("checkpoint: pin: %w", err)
	}
	step, ok = parseStep(strings.TrimSuffix(string(b), "\n"))
	if !ok {
		return 0, false, fmt.Errorf("checkpoint: pin: %w", corruptf("%s holds %q, not a step", pinName(m.cfg.Job), b))
	}
	return step, true, nil
}
