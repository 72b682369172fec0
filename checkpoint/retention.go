package checkpoint

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// PruneResult reports what Prune kept and deleted.
type PruneResult struct {
	Kept           []uint64 // steps of the commits kept, newest first
	DeletedCommits []uint64
	DeletedObjects int
}

// Prune applies retention: it keeps the newest KeepLast commits, every commit whose sequence number
// is a multiple of KeepEvery, a fallback whose chains share no object with the newest commit's
// (see the package doc) and the pinned commit (Pin), deletes the other commit records (records first, so a crash midway never
// leaves a commit whose data is gone), then deletes every object older than the newest commit that no
// kept commit needs. The newest commit, every manifest a kept delta chains back to (its base and the
// deltas between), and everything newer than the newest commit (persists in progress) are never
// deleted. It returns an error without deleting data if a kept commit's chain cannot be read.
func (m *Committer) Prune(ctx context.Context) (PruneResult, error) {
	res, err := m.prune(ctx, false)
	m.mu.Lock()
	if err != nil {
		m.stats.PruneErrors++
	}
	m.stats.PrunedCommits += uint64(len(res.DeletedCommits))
	m.stats.PrunedObjects += uint64(res.DeletedObjects)
	m.mu.Unlock()
	if err != nil {
		return res, fmt.Errorf("checkpoint: prune: %w", err)
	}
	return res, nil
}

// prune applies retention; with all, persists newer than the newest commit go too unless a
// commit needs them (Clean: nothing is being persisted).
func (m *Committer) prune(ctx context.Context, all bool) (PruneResult, error) {
	var res PruneResult
	st, job := m.cfg.Storage, m.cfg.Job
	valid, invalid, err := m.validCommits(ctx)
	if err != nil {
		return res, err
	}
	if len(valid) == 0 && !all {
		return res, nil
	}
	newest := uint64(math.MaxUint64) // with no commit, every object is older than "the newest"
	if len(valid) > 0 {
		newest = valid[0].Step
	}
	keepLast := m.cfg.KeepLast
	if keepLast <= 0 {
		keepLast = DefaultKeepLast
	}
	var kept []*commitRecord
	var drop []uint64
	for i, rec := range valid {
		if i < keepLast || (m.cfg.KeepEvery > 0 && rec.Seq%uint64(m.cfg.KeepEvery) == 0) {
			kept = append(kept, rec)
			res.Kept = append(res.Kept, rec.Step)
		} else {
			drop = append(drop, rec.Step)
		}
	}
	var damaged []badCommit // unreadable records are evidence: moved aside, not deleted
	for _, b := range invalid {
		switch {
		case b.Step >= newest:
		case b.void:
			drop = append(drop, b.Step)
		default:
			damaged = append(damaged, b)
		}
	}
	// spare keeps rec too, beyond the policy above.
	spare := func(rec *commitRecord) {
		kept = append(kept, rec)
		slices.SortFunc(kept, func(a, b *commitRecord) int { return cmp.Compare(b.Step, a.Step) })
		res.Kept = res.Kept[:0]
		for _, rec := range kept {
			res.Kept = append(res.Kept, rec.Step)
		}
		drop = slices.DeleteFunc(drop, func(s uint64) bool { return s == rec.Step })
	}
	// Keep a fallback: a commit whose chains share no object with the newest commit's, so one
	// corrupt byte in the newest chain (its base, most likely, which every later delta needs)
	// always leaves a commit to restore. The newest such commit is kept until a kept one is.
	if fb, err := m.fallback(ctx, valid, kept); err != nil {
		return res, err
	} else if fb != nil && !slices.Contains(kept, fb) {
		spare(fb)
	}
	// The pinned commit (Pin) stays besides: after the fallback, so that it never stands in
	// for one. An unreadable pin stops retention before anything is deleted.
	pinned, havePin, err := m.Pinned(ctx)
	if err != nil {
		return res, err
	}
	for _, rec := range valid {
		if havePin && rec.Step == pinned && !slices.Contains(kept, rec) {
			spare(rec)
		}
	}

	// Directories still needed: those of kept commits' manifest chains and blobs, and of the chains of
	// manifests newer than the newest commit. Resolve them all before deleting anything.
	needed := map[string]bool{}
	var roots []string
	for _, rec := range kept {
		if rec.BlobDir != "" {
			needed[rec.BlobDir] = true
		}
		for _, n := range rec.Nodes {
			roots = append(roots, n.Manifest)
		}
	}
	names, err := st.List(ctx, dataPrefix(job))
	if err != nil {
		return res, err
	}
	for _, n := range names {
		if s, ok := dataStep(job, n); ok && s > newest && !all && strings.HasSuffix(n, "/manifest") {
			roots = append(roots, n)
		}
	}
	for _, root := range roots {
		if err := m.markChain(ctx, root, needed); err != nil {
			return res, err
		}
	}
	wholeSteps, err := m.markQuarantined(ctx, needed)
	if err != nil {
		return res, err
	}

	for _, b := range damaged {
		if _, err := m.Quarantine(ctx, b.Step, b.err); err != nil {
			return res, err
		}
	}
	for _, s := range drop {
		if err := st.Delete(ctx, commitName(job, s)); err != nil {
			return res, err
		}
		res.DeletedCommits = append(res.DeletedCommits, s)
	}
	var errs []error
	for _, n := range names {
		s, ok := dataStep(job, n)
		if !ok || (s >= newest && !all) || needed[objectDir(n)] || wholeSteps[s] {
			continue
		}
		if err := st.Delete(ctx, n); err != nil {
			errs = append(errs, err)
			continue
		}
		res.DeletedObjects++
	}
	return res, errors.Join(errs...)
}

// fallback returns the commit retention keeps so that the newest commit (valid[0]) is not the
// only one restorable: the first kept commit whose manifest chains share no directory with the
// newest's, else the newest such commit of valid, else nil (there is none yet: every commit
// depends on the newest's base). A commit whose chain cannot be read is not a fallback.
func (m *Committer) fallback(ctx context.Context, valid, kept []*commitRecord) (*commitRecord, error) {
	if len(valid) < 2 {
		return nil, nil
	}
	newest, ok, err := m.commitDirs(ctx, valid[0])
	if err != nil || !ok {
		return nil, err
	}
	independent := func(rec *commitRecord) (bool, error) {
		dirs, ok, err := m.commitDirs(ctx, rec)
		if err != nil || !ok {
			return false, err
		}
		for d := range dirs {
			if newest[d] {
				return false, nil
			}
		}
		return true, nil
	}
	for _, rec := range kept[1:] {
		if ok, err := independent(rec); err != nil || ok {
			return rec, err
		}
	}
	for _, rec := range valid[1:] {
		if slices.Contains(kept, rec) {
			continue
		}
		if ok, err := independent(rec); err != nil || ok {
			return rec, err
		}
	}
	return nil, nil
}

// commitDirs returns the persist directories of every node's manifest chain of rec; ok is false
// when a manifest of a chain is missing or corrupt (rec cannot be restored anyway).
func (m *Committer) commitDirs(ctx context.Context, rec *commitRecord) (map[string]bool, bool, error) {
	dirs := map[string]bool{}
	for _, n := range rec.Nodes {
		for name := n.Manifest; name != ""; {
			dirs[strings.TrimSuffix(name, "/manifest")] = true
			if len(dirs) > maxChain*len(rec.Nodes) {
				return nil, false, nil
			}
			b, err := getObject(ctx, m.cfg.Storage, name, nil, -1, maxManifest)
			var man *manifest
			if err == nil {
				man, err = decodeManifest(b)
			}
			if err != nil {
				if skippable(err) {
					return nil, false, nil
				}
				return nil, false, err
			}
			name = man.Parent
		}
	}
	return dirs, true, nil
}

// markChain marks the directory of the manifest root and of every parent back to its base. A missing
// or corrupt manifest ends the walk (that chain is unrestorable anyway); other errors are returned.
func (m *Committer) markChain(ctx context.Context, root string, needed map[string]bool) error {
	for name := root; name != ""; {
		dir := strings.TrimSuffix(name, "/manifest")
		if needed[dir] {
			return nil
		}
		needed[dir] = true
		b, err := getObject(ctx, m.cfg.Storage, name, nil, -1, maxManifest)
		if err == nil {
			var man *manifest
			if man, err = decodeManifest(b); err == nil {
				name = man.Parent
				continue
			}
		}
		if skippable(err) {
			m.log.Warn("checkpoint: retention found an unreadable manifest", "name", name, "err", err)
			return nil
		}
		return err
	}
	return nil
}

// objectDir returns the persist directory (JOB/data/STEP/NODE/ID) of an object name.
func objectDir(name string) string {
	parts := strings.SplitN(name, "/", 6)
	if len(parts) < 6 {
		return name
	}
	return strings.Join(parts[:5], "/")
}

// DeleteAll deletes every object of the job in the storage: its commit records first (so that a
// crash midway never leaves a commit whose data is gone), then the persists, the coordinators'
// claims, the pin and the quarantined commits, and the temporary data of unfinished writes when
// the Storage is a TempRemover. It returns the number of objects deleted. Nothing of the job can
// be restored afterwards: call it only to start the job afresh over an earlier run, while no node
// of the job persists and no coordinator of it commits.
func (m *Committer) DeleteAll(ctx context.Context) (int, error) {
	st, job := m.cfg.Storage, m.cfg.Job
	records, err := st.List(ctx, commitsPrefix(job))
	if err != nil {
		return 0, fmt.Errorf("checkpoint: delete the job: %w", err)
	}
	rest, err := st.List(ctx, job+"/")
	if err != nil {
		return 0, fmt.Errorf("checkpoint: delete the job: %w", err)
	}
	n := 0
	for _, name := range records {
		if err := st.Delete(ctx, name); err != nil {
			return n, fmt.Errorf("checkpoint: delete the job: %w", err)
		}
		n++
	}
	for _, name := range rest {
		if strings.HasPrefix(name, commitsPrefix(job)) {
			continue
		}
		if err := st.Delete(ctx, name); err != nil {
			return n, fmt.Errorf("checkpoint: delete the job: %w", err)
		}
		n++
	}
	if tr, ok := st.(TempRemover); ok {
		if _, err := tr.RemoveTemp(ctx, job+"/", time.Now()); err != nil {
			return n, fmt.Errorf("checkpoint: delete the job: %w", err)
		}
	}
	return n, nil
}

// ExistingCommitsError is PrepareFresh's refusal to let a job start afresh over the commits of
// an earlier run of it; errors.Is(err, ErrExistingCommits) holds.
type ExistingCommitsError struct {
	Job     string
	Commits int    // commit records in the storage
	Newest  uint64 // the step of the newest
}

func (e *ExistingCommitsError) Error() string {
	return fmt.Sprintf("%v: %d commits of job %q, the newest of step %d (resume that run, or overwrite it to start afresh)",
		ErrExistingCommits, e.Commits, e.Job, e.Newest)
}

// Is makes errors.Is(err, ErrExistingCommits) hold.
func (e *ExistingCommitsError) Is(target error) bool { return target == ErrExistingCommits }

// PrepareFresh readies the storage for a run of the job that starts afresh rather than resuming.
// When it holds no commit record of the job, it does nothing. Otherwise, without overwrite, it
// returns an *ExistingCommitsError and deletes nothing; with overwrite, it deletes every object
// of the job (DeleteAll) and logs how many. Call it before anything of the new run persists or
// commits: a program calls it to refuse before it starts its processes and shared memory, and a
// coordinator (elastic.Config.Overwrite) before it places the slots.
func (m *Committer) PrepareFresh(ctx context.Context, overwrite bool) error {
	records, err := m.Records(ctx)
	if err != nil {
		return fmt.Errorf("checkpoint: look for earlier commits: %w", err)
	}
	if len(records) == 0 {
		return nil
	}
	existing := &ExistingCommitsError{Job: m.cfg.Job, Commits: len(records), Newest: records[0]}
	if !overwrite {
		return existing
	}
	n, err := m.DeleteAll(ctx)
	if err != nil {
		return fmt.Errorf("checkpoint: overwrite the earlier run (%d commits, the newest of step %d): %w", existing.Commits, existing.Newest, err)
	}
	m.log.Info("deleted the checkpoints of an earlier run to start afresh", "job", m.cfg.Job, "commits", existing.Commits, "newest", existing.Newest, "objects", n)
	return nil
}
