package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
)

// Coordinator takeover. A coordinator that takes over a job (a restarted one, or a second one
// started by hand while the first still runs) claims a new incarnation with Committer.Claim: an
// object JOB/coordinators/INC created only if the name is free (ExclusiveStorage.PutNew), holding
// the step it restored (its base; a Committer that commits without having claimed claims with
// base 0 first: it started the job afresh). Every commit record names the incarnation that wrote it, and a
// record of incarnation i at step s is void once some claim k > i has a base below s: it belongs
// to a future the job abandoned when k took over, whenever it was written. So two coordinators
// never both commit: whichever claimed last decides, without locks or clocks, and readers
// (Commits, Choose, Prune) skip void records. A coordinator whose commit a newer claim voids gets
// ErrSuperseded.

// ExclusiveStorage is a Storage that can create an object only while its name is free: what
// Committer.Claim needs. FSStorage, MemStorage and FaultStorage (over one) implement it.
type ExclusiveStorage interface {
	Storage
	// PutNew stores data durably under name unless an object of that name exists, in which
	// case it returns an error wrapping fs.ErrExist and changes nothing.
	PutNew(ctx context.Context, name string, data []byte) error
}

// ErrSuperseded is returned by Commit when another coordinator has taken over the job since this
// one's Claim: nothing this one commits can be restored any more.
var ErrSuperseded = errors.New("checkpoint: another coordinator took over the job")

const (
	claimMagic   = "EPSCLAIM"
	claimVersion = 1
)

func claimsPrefix(job string) string          { return job + "/coordinators/" }
func claimName(job string, inc uint64) string { return claimsPrefix(job) + stepName(inc) }

// claim is one coordinator's claim of an incarnation.
type claim struct {
	inc, base uint64
}

func appendClaim(c claim) []byte {
	e := encoder{b: []byte(claimMagic)}
	e.u32(claimVersion)
	e.u64(c.inc)
	e.u64(c.base)
	return e.seal()
}

func decodeClaim(b []byte) (claim, error) {
	d, err := openFile(b, claimMagic, claimVersion)
	if err != nil {
		return claim{}, err
	}
	c := claim{inc: d.u64(), base: d.u64()}
	if err := d.done(); err != nil {
		return claim{}, fmt.Errorf("claim: %w", err)
	}
	return c, nil
}

// claims reads every claim of the job. An unreadable claim is an error: skipping it could
// revive commits it voids.
func (m *Committer) claims(ctx context.Context) ([]claim, error) {
	st, job := m.cfg.Storage, m.cfg.Job
	names, err := st.List(ctx, claimsPrefix(job))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list claims: %w", err)
	}
	var out []claim
	for _, n := range names {
		inc, ok := parseStep(strings.TrimPrefix(n, claimsPrefix(job)))
		if !ok {
			continue
		}
		b, err := getObject(ctx, st, n, nil, -1, 1<<10)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: claim %d: %w", inc, err)
		}
		c, err := decodeClaim(b)
		if err != nil || c.inc != inc {
			return nil, fmt.Errorf("checkpoint: claim %d: %w", inc, errors.Join(err, ErrCorrupt))
		}
		out = append(out, c)
	}
	return out, nil
}

// Claim makes this Committer the job's coordinator as a new incarnation, above every earlier
// claim, with base the step it restored (0 for a job started afresh): commits of earlier
// incarnations after base become void, and this Committer's commits carry the incarnation. It
// returns the incarnation. The storage must be an ExclusiveStorage.
func (m *Committer) Claim(ctx context.Context, base uint64) (uint64, error) {
	ex, ok := m.cfg.Storage.(ExclusiveStorage)
	if !ok {
		return 0, fmt.Errorf("checkpoint: claim: storage %T cannot create objects exclusively", m.cfg.Storage)
	}
	for {
		cs, err := m.claims(ctx)
		if err != nil {
			return 0, err
		}
		inc := uint64(1)
		for _, c := range cs {
			inc = max(inc, c.inc+1)
		}
		err = ex.PutNew(ctx, claimName(m.cfg.Job, inc), appendClaim(claim{inc: inc, base: base}))
		if errors.Is(err, fs.ErrExist) {
			continue // another coordinator claimed it first: go above it
		}
		if err != nil {
			return 0, fmt.Errorf("checkpoint: claim incarnation %d: %w", inc, err)
		}
		m.mu.Lock()
		m.inc = inc
		m.mu.Unlock()
		m.log.Info("checkpoint: claimed the job", "incarnation", inc, "base", base)
		return inc, nil
	}
}

// Incarnation returns the incarnation this Committer claimed (0: none).
func (m *Committer) Incarnation() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inc
}

// void reports whether a commit of incarnation inc at step is void under claims.
func void(cs []claim, inc, step uint64) bool {
	for _, c := range cs {
		if c.inc > inc && c.base < step {
			return true
		}
	}
	return false
}

// superseded reports whether a claim above this Committer's voids a commit at step.
func (m *Committer) superseded(ctx context.Context, step uint64) error {
	inc := m.Incarnation()
	cs, err := m.claims(ctx)
	if err != nil {
		return err
	}
	for _, c := range cs {
		if c.inc > inc && c.base < step {
			return fmt.Errorf("%w (incarnation %d, this one is %d)", ErrSuperseded, c.inc, inc)
		}
	}
	return nil
}

// autoClaim claims the job afresh (base 0) for a Committer that commits without having claimed,
// when the storage allows it; on another storage its commits are not fenced (incarnation 0).
func (m *Committer) autoClaim(ctx context.Context) error {
	if m.Incarnation() != 0 {
		return nil
	}
	if _, ok := m.cfg.Storage.(ExclusiveStorage); !ok {
		return nil
	}
	_, err := m.Claim(ctx, 0)
	return err
}

// badCommit is a commit record validCommits left out: unreadable (err), or void under a newer
// claim.
type badCommit struct {
	Step uint64
	err  error
	void bool
}

// validCommits reads the job's commit records, newest step first: those that read back and are
// not void, and the others (unreadable, or void under a newer claim).
func (m *Committer) validCommits(ctx context.Context) (valid []*commitRecord, bad []badCommit, err error) {
	st, job := m.cfg.Storage, m.cfg.Job
	steps, err := commitSteps(ctx, st, job)
	if err != nil {
		return nil, nil, err
	}
	cs, err := m.claims(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range steps {
		rec, err := readCommit(ctx, st, job, s)
		switch {
		case err == nil && void(cs, rec.Inc, s):
			m.log.Warn("checkpoint: commit void: a coordinator took over from an earlier step", "step", s, "incarnation", rec.Inc)
			bad = append(bad, badCommit{Step: s, void: true})
		case err == nil:
			valid = append(valid, rec)
		case skippable(err):
			m.log.Warn("checkpoint: unreadable commit record", "step", s, "err", err)
			bad = append(bad, badCommit{Step: s, err: err})
		default:
			return nil, nil, err
		}
	}
	return valid, bad, nil
}
