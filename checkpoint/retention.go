package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// PruneResult reports what Prune kept and deleted.
type PruneResult struct {
	Kept           []uint64 // steps of the commits kept, newest first
	DeletedCommits []uint64
	DeletedObjects int
}

// Prune applies retention: it keeps the newest KeepLast commits and every commit whose sequence number
// is a multiple of KeepEvery, deletes the other commit records (records first, so a crash midway never
// leaves a commit whose data is gone), then deletes every object older than the newest commit that no
// kept commit needs. The newest commit, every manifest a kept delta chains back to (its base and the
// deltas between), and everything newer than the newest commit (persists in progress) are never
// deleted. It returns an error without deleting data if a kept commit's chain cannot be read.
func (m *Committer) Prune(ctx context.Context) (PruneResult, error) {
	res, err := m.prune(ctx)
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

func (m *Committer) prune(ctx context.Context) (PruneResult, error) {
	var res PruneResult
	st, job := m.cfg.Storage, m.cfg.Job
	valid, invalid, err := m.validCommits(ctx)
	if err != nil {
		return res, err
	}
	if len(valid) == 0 {
		return res, nil
	}
	newest := valid[0].Step
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
	for _, s := range invalid {
		if s < newest {
			drop = append(drop, s)
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
		if s, ok := dataStep(job, n); ok && s > newest && strings.HasSuffix(n, "/manifest") {
			roots = append(roots, n)
		}
	}
	for _, root := range roots {
		if err := m.markChain(ctx, root, needed); err != nil {
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
		if !ok || s >= newest || needed[objectDir(n)] {
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
