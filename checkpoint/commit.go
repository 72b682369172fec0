package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"golang.org/x/sync/errgroup"
)

// Committer is the coordinator's side of the two-phase checkpoint protocol. Phase one is every node's
// persist, which ends with its manifest written last; phase two is Commit, which checks that the
// manifests of a step form a whole checkpoint and then writes the job-level commit record. A step
// without a commit record is never restored. Committer also chooses the step to restore (Choose),
// keeps the coordinator's blobs, and applies retention (Prune). It has no goroutines and is safe for
// concurrent use, but commits of one job should come from one coordinator at a time.
type Committer struct {
	cfg CommitterConfig
	log *slog.Logger
	cs  *codecs

	mu    sync.Mutex
	stats CommitterStats
	inc   uint64 // the incarnation claimed (Claim), 0 before
}

// CommitterStats are a Committer's counters.
type CommitterStats struct {
	Commits       uint64
	CommitErrors  uint64
	PruneErrors   uint64
	PrunedCommits uint64
	PrunedObjects uint64
}

// CommitInfo describes a commit.
type CommitInfo struct {
	Step  uint64
	Seq   uint64   // position in the job's commit sequence
	Nodes []string // nodes whose manifests the commit holds
	Blobs []string // names of the coordinator's blobs
}

// NewCommitter returns a Committer for one job.
func NewCommitter(cfg CommitterConfig) (*Committer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.KeepLast == 0 {
		cfg.KeepLast = DefaultKeepLast
	}
	return &Committer{cfg: cfg, log: discardIfNil(cfg.Logger), cs: newCodecs(1)}, nil
}

// Stats returns a copy of the counters.
func (m *Committer) Stats() CommitterStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stats
}

// Commit writes the commit record of step after checking that manifests (one per node, as returned by
// each node's WaitPersisted) are durable and intact, agree on the job and slot count, own every slot
// exactly once, and that every delta's chain back to its base is present. blobs (the dispatcher's
// snapshot, the coordinator's state, ...) are written before the record and restored with it. A failed
// Commit leaves earlier commits untouched; an error wrapping ErrIncomplete means the manifests do not
// form a checkpoint. After a successful commit, retention runs unless KeepLast is negative; its
// failures are logged, not returned.
func (m *Committer) Commit(ctx context.Context, step uint64, manifests []ManifestRef, blobs ...Blob) (CommitInfo, error) {
	info, err := m.commit(ctx, step, manifests, blobs)
	m.mu.Lock()
	if err != nil {
		m.stats.CommitErrors++
	} else {
		m.stats.Commits++
	}
	m.mu.Unlock()
	if err != nil {
		return CommitInfo{}, fmt.Errorf("checkpoint: commit step %d: %w", step, err)
	}
	if m.cfg.KeepLast > 0 {
		if _, err := m.Prune(ctx); err != nil {
			m.log.Warn("checkpoint: retention failed", "err", err)
		}
	}
	return info, nil
}

func (m *Committer) commit(ctx context.Context, step uint64, refs []ManifestRef, blobs []Blob) (CommitInfo, error) {
	st, job := m.cfg.Storage, m.cfg.Job
	if err := m.autoClaim(ctx); err != nil {
		return CommitInfo{}, err
	}
	if err := m.superseded(ctx, step); err != nil {
		return CommitInfo{}, err
	}
	if len(refs) == 0 {
		return CommitInfo{}, fmt.Errorf("%w: no manifests", ErrIncomplete)
	}
	seen := map[string]bool{}
	for _, r := range refs {
		if !validIdent(r.Node) || seen[r.Node] || r.Step != step || validName(r.Name) != nil {
			return CommitInfo{}, fmt.Errorf("%w: bad or repeated manifest reference %+v", ErrIncomplete, r)
		}
		seen[r.Node] = true
	}
	bseen := map[string]bool{}
	for _, b := range blobs {
		if !validIdent(b.Name) || bseen[b.Name] {
			return CommitInfo{}, fmt.Errorf("checkpoint: bad or repeated blob name %q", b.Name)
		}
		bseen[b.Name] = true
	}
	mans := make([]*manifest, len(refs))
	eg, ectx := errgroup.WithContext(ctx)
	eg.SetLimit(8)
	for i, r := range refs {
		eg.Go(func() error {
			man, err := m.checkNode(ectx, r)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("%w: node %s: %w", ErrIncomplete, r.Node, err)
			}
			mans[i] = man
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		return CommitInfo{}, err
	}
	S := mans[0].Slots
	cover := newSlotSet(S)
	for _, man := range mans {
		if man.Slots != S {
			return CommitInfo{}, fmt.Errorf("%w: node %s has %d slots, node %s has %d", ErrIncomplete, man.Node, man.Slots, mans[0].Node, S)
		}
		if cover.intersect(man.Owned).count() > 0 {
			return CommitInfo{}, fmt.Errorf("%w: node %s owns slots another node owns", ErrIncomplete, man.Node)
		}
		for i, w := range man.Owned.bits {
			cover.bits[i] |= w
		}
	}
	if missing := S - cover.count(); missing > 0 {
		return CommitInfo{}, fmt.Errorf("%w: %d of %d slots have no owner", ErrIncomplete, missing, S)
	}
	rec := &commitRecord{Job: job, Step: step, Slots: S, Inc: m.Incarnation()}
	for i, man := range mans {
		rec.Nodes = append(rec.Nodes, commitNode{Node: man.Node, Manifest: refs[i].Name, Size: uint64(refs[i].Size),
			Sum: refs[i].Sum, Segments: man.Segments})
	}
	var w *objWriter
	if len(blobs) > 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return CommitInfo{}, err
		}
		rec.BlobDir = persistDir(job, step, coordinatorNode, binary.LittleEndian.Uint64(b[:]))
		w = &objWriter{st: st, dir: rec.BlobDir}
		for i, b := range blobs {
			ref, err := w.putBlob(ctx, blobObject(i), b.Name, b.Data, m.cfg.Codec, m.cs)
			if err != nil {
				w.cleanup()
				return CommitInfo{}, fmt.Errorf("blob %s: %w", b.Name, err)
			}
			rec.Blobs = append(rec.Blobs, ref)
		}
	}
	seq, err := m.lastSeq(ctx)
	if err != nil {
		if w != nil {
			w.cleanup()
		}
		return CommitInfo{}, err
	}
	rec.Seq = seq + 1
	if err := putObject(ctx, st, commitName(job, step), appendCommit(nil, rec)); err != nil {
		// The record may have become visible although the call failed (a rename that succeeded before
		// a directory sync failed); keep the blobs it might point to.
		return CommitInfo{}, err
	}
	// A takeover claimed between the check above and the record voids it: say so. (Failing to
	// read the claims now says nothing about the record, which is written.)
	if err := m.superseded(ctx, step); errors.Is(err, ErrSuperseded) {
		return CommitInfo{}, err
	} else if err != nil {
		m.log.Warn("checkpoint: could not check for a takeover after the commit", "step", step, "err", err)
	}
	return recInfo(rec), nil
}

func recInfo(rec *commitRecord) CommitInfo {
	info := CommitInfo{Step: rec.Step, Seq: rec.Seq}
	for _, n := range rec.Nodes {
		info.Nodes = append(info.Nodes, n.Node)
	}
	for _, b := range rec.Blobs {
		info.Blobs = append(info.Blobs, b.Name)
	}
	return info
}

// checkNode reads one node's manifest and its chain and checks that every object they name exists.
func (m *Committer) checkNode(ctx context.Context, r ManifestRef) (*manifest, error) {
	st := m.cfg.Storage
	b, err := getObject(ctx, st, r.Name, nil, r.Size, 0)
	if err != nil {
		return nil, err
	}
	if xxhashSum(b) != r.Sum {
		return nil, corruptf("manifest %s: checksum differs from the reference", r.Name)
	}
	top, err := decodeManifest(b)
	if err != nil {
		return nil, err
	}
	if top.Job != m.cfg.Job || top.Node != r.Node || top.Step != r.Step {
		return nil, corruptf("manifest %s is for job %q node %q step %d", r.Name, top.Job, top.Node, top.Step)
	}
	for cur := top; ; {
		if err := checkObjects(ctx, st, cur); err != nil {
			return nil, err
		}
		if cur.Full {
			return top, nil
		}
		b, err := getObject(ctx, st, cur.Parent, nil, -1, maxManifest)
		if err != nil {
			return nil, fmt.Errorf("parent of step %d: %w", cur.Step, err)
		}
		p, err := decodeManifest(b)
		if err != nil {
			return nil, fmt.Errorf("parent of step %d: %w", cur.Step, err)
		}
		if p.Job != top.Job || p.Node != top.Node || p.Step != cur.ParentStep || p.BaseStep != top.BaseStep || p.Slots != top.Slots {
			return nil, corruptf("parent %s does not continue the chain", cur.Parent)
		}
		cur = p
	}
}

// checkObjects checks that every chunk and blob of a manifest exists.
func checkObjects(ctx context.Context, st Storage, man *manifest) error {
	names, err := st.List(ctx, man.dir()+"/")
	if err != nil {
		return err
	}
	for _, t := range man.Tables {
		for _, c := range t.Chunks {
			if _, ok := slices.BinarySearch(names, man.dir()+"/"+c.Object); !ok {
				return fmt.Errorf("%w: chunk %s/%s", ErrNotFound, man.dir(), c.Object)
			}
		}
	}
	for _, b := range man.Blobs {
		if _, ok := slices.BinarySearch(names, man.dir()+"/"+b.Object); !ok {
			return fmt.Errorf("%w: blob %s/%s", ErrNotFound, man.dir(), b.Object)
		}
	}
	return nil
}

// lastSeq returns the sequence number of the newest valid commit, or 0.
func (m *Committer) lastSeq(ctx context.Context) (uint64, error) {
	valid, _, err := m.validCommits(ctx)
	if err != nil {
		return 0, err
	}
	var seq uint64
	for _, rec := range valid {
		seq = max(seq, rec.Seq)
	}
	return seq, nil
}

// Commits returns the job's valid commits, newest first. Unreadable commit records, and those a
// coordinator's takeover voided (see Claim), are logged and left out.
func (m *Committer) Commits(ctx context.Context) ([]CommitInfo, error) {
	valid, _, err := m.validCommits(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]CommitInfo, 0, len(valid))
	for _, rec := range valid {
		out = append(out, recInfo(rec))
	}
	return out, nil
}

// Choose returns the newest commit whose coordinator blobs are intact and for which verify returns
// nil; verify typically asks every node to Verify the step (in parallel) and joins their errors.
// Commits that are corrupt, truncated or missing pieces (errors wrapping ErrCorrupt, ErrNotFound or
// ErrNotCommitted) are skipped with a logged reason; any other error is returned. With no usable
// commit it returns ErrNoCheckpoint.
func (m *Committer) Choose(ctx context.Context, verify func(ctx context.Context, step uint64) error) (CommitInfo, error) {
	info, _, err := m.ChooseReport(ctx, verify)
	return info, err
}

func (m *Committer) checkBlobs(ctx context.Context, rec *commitRecord) error {
	for _, b := range rec.Blobs {
		if _, err := readBlob(ctx, m.cfg.Storage, rec.BlobDir+"/"+b.Object, b, m.cs); err != nil {
			return fmt.Errorf("coordinator blob %s: %w", b.Name, err)
		}
	}
	return nil
}

// Blob returns the coordinator blob name saved by the commit of step.
func (m *Committer) Blob(ctx context.Context, step uint64, name string) ([]byte, error) {
	rec, err := readCommit(ctx, m.cfg.Storage, m.cfg.Job, step)
	if err != nil {
		return nil, err
	}
	for _, b := range rec.Blobs {
		if b.Name == name {
			return readBlob(ctx, m.cfg.Storage, rec.BlobDir+"/"+b.Object, b, m.cs)
		}
	}
	return nil, fmt.Errorf("%w: blob %q in the commit of step %d", ErrNotFound, name, step)
}

// Records returns the steps of every commit record of the job, valid or not (void, unreadable),
// newest first: what a run that starts the job afresh in this storage would void and retention
// then delete. Quarantined commits are not among them.
func (m *Committer) Records(ctx context.Context) ([]uint64, error) {
	return commitSteps(ctx, m.cfg.Storage, m.cfg.Job)
}

// RecordsAfter returns the steps of the job's commit records above step, valid or not (void,
// unreadable), newest first. A coordinator taking over a running job checks that none was
// written above the commit it restores: one that was may have moved the servers past it.
func (m *Committer) RecordsAfter(ctx context.Context, step uint64) ([]uint64, error) {
	steps, err := commitSteps(ctx, m.cfg.Storage, m.cfg.Job)
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, s := range steps {
		if s > step {
			out = append(out, s)
		}
	}
	return out, nil
}

// DropAfter deletes the commit records of steps after step, newest first. A coordinator that restored
// step calls it so that commits from the abandoned future are never restored later; their data goes
// with the next Prune.
func (m *Committer) DropAfter(ctx context.Context, step uint64) error {
	steps, err := commitSteps(ctx, m.cfg.Storage, m.cfg.Job)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range steps {
		if s > step {
			if err := m.cfg.Storage.Delete(ctx, commitName(m.cfg.Job, s)); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("checkpoint: drop commits after %d: %w", step, err)
	}
	return nil
}
