package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Quarantine. A commit that turns out unrestorable (a flipped byte, a missing chunk) is evidence of
// a fault in the storage or in the program, so it is moved aside rather than deleted: its commit
// record goes to JOB/quarantine/STEP-ID/commit with the reason beside it (.../reason), and
// retention keeps every object the record names until an operator deletes the quarantine
// directory. A quarantined commit is never restored or counted.

func quarantinePrefix(job string) string { return job + "/quarantine/" }

// SkippedCommit is a commit Choose passed over because it cannot be restored.
type SkippedCommit struct {
	Step uint64
	// Err says what failed, naming the object: it wraps ErrCorrupt, ErrNotFound or ErrNotCommitted.
	Err error
}

func (s SkippedCommit) String() string { return fmt.Sprintf("step %d: %v", s.Step, s.Err) }

// ChooseReport is Choose that also returns the newer commits it skipped, newest first, each with
// its reason, whether or not a commit was found (ErrNoCheckpoint). Unreadable commit records are
// among them; commits void under a takeover are not (they are not damaged, only abandoned).
func (m *Committer) ChooseReport(ctx context.Context, verify func(ctx context.Context, step uint64) error) (CommitInfo, []SkippedCommit, error) {
	valid, bad, err := m.validCommits(ctx)
	if err != nil {
		return CommitInfo{}, nil, err
	}
	var skipped []SkippedCommit
	unreadable := func(above uint64) {
		for _, b := range bad {
			if b.Step > above && !b.void && !containsStep(skipped, b.Step) {
				skipped = append(skipped, SkippedCommit{Step: b.Step, Err: b.err})
			}
		}
	}
	for _, rec := range valid {
		s := rec.Step
		err := m.checkBlobs(ctx, rec)
		if err == nil && verify != nil {
			err = verify(ctx, s)
		}
		unreadable(s)
		if err == nil {
			sortSkipped(skipped)
			return recInfo(rec), skipped, nil
		}
		if !skippable(err) {
			return CommitInfo{}, skipped, err
		}
		m.log.Warn("checkpoint: skipping checkpoint", "step", s, "reason", err)
		skipped = append(skipped, SkippedCommit{Step: s, Err: err})
	}
	unreadable(0)
	sortSkipped(skipped)
	return CommitInfo{}, skipped, ErrNoCheckpoint
}

func containsStep(ss []SkippedCommit, step uint64) bool {
	for _, s := range ss {
		if s.Step == step {
			return true
		}
	}
	return false
}

func sortSkipped(ss []SkippedCommit) {
	for i := 1; i < len(ss); i++ {
		for j := i; j > 0 && ss[j].Step > ss[j-1].Step; j-- {
			ss[j], ss[j-1] = ss[j-1], ss[j]
		}
	}
}

// Quarantine moves the commit of step aside, with reason, and returns the directory it went to
// (JOB/quarantine/STEP-ID). The commit is no longer restored, listed or pruned, and neither is
// anything its record names; deleting the directory's objects lets the next Prune reclaim them.
// It returns an error wrapping ErrNotCommitted when there is no commit record of step.
func (m *Committer) Quarantine(ctx context.Context, step uint64, reason error) (string, error) {
	st, job := m.cfg.Storage, m.cfg.Job
	raw, err := getObject(ctx, st, commitName(job, step), nil, -1, maxCommitRecord)
	if errors.Is(err, ErrNotFound) {
		return "", fmt.Errorf("checkpoint: quarantine: %w: step %d", ErrNotCommitted, step)
	}
	if err != nil {
		return "", fmt.Errorf("checkpoint: quarantine step %d: %w", step, err)
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", err
	}
	dir := fmt.Sprintf("%s%s-%016x", quarantinePrefix(job), stepName(step), binary.LittleEndian.Uint64(id[:]))
	why := "unknown"
	if reason != nil {
		why = reason.Error()
	}
	note := fmt.Sprintf("step %d quarantined at %s\nreason: %s\n", step, time.Now().UTC().Format(time.RFC3339), why)
	if err := putObject(ctx, st, dir+"/reason", []byte(note)); err != nil {
		return "", fmt.Errorf("checkpoint: quarantine step %d: %w", step, err)
	}
	if err := putObject(ctx, st, dir+"/commit", raw); err != nil {
		return "", fmt.Errorf("checkpoint: quarantine step %d: %w", step, err)
	}
	if err := st.Delete(ctx, commitName(job, step)); err != nil {
		return "", fmt.Errorf("checkpoint: quarantine step %d: %w", step, err)
	}
	m.log.Warn("checkpoint: commit quarantined", "step", step, "dir", dir, "reason", why)
	return dir, nil
}

// Quarantined returns the quarantine directories of the job, oldest step first.
func (m *Committer) Quarantined(ctx context.Context) ([]string, error) {
	names, err := m.cfg.Storage.List(ctx, quarantinePrefix(m.cfg.Job))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list quarantine: %w", err)
	}
	var dirs []string
	for _, n := range names {
		if d, ok := strings.CutSuffix(n, "/commit"); ok {
			dirs = append(dirs, d)
		}
	}
	return dirs, nil
}

// quarantineStep parses the step of a quarantine directory.
func quarantineStep(job, dir string) (uint64, bool) {
	s, _, _ := strings.Cut(strings.TrimPrefix(dir, quarantinePrefix(job)), "-")
	return parseStep(s)
}

// markQuarantined marks, in needed, the directories every quarantined commit names (its chains
// and blobs), and returns the steps of quarantined records that cannot be read: every object of
// such a step is kept, as its record cannot say which it needs.
func (m *Committer) markQuarantined(ctx context.Context, needed map[string]bool) (map[uint64]bool, error) {
	dirs, err := m.Quarantined(ctx)
	if err != nil {
		return nil, err
	}
	whole := map[uint64]bool{}
	for _, d := range dirs {
		b, err := getObject(ctx, m.cfg.Storage, d+"/commit", nil, -1, maxCommitRecord)
		var rec *commitRecord
		if err == nil {
			rec, err = decodeCommit(b)
		}
		if err != nil {
			if !skippable(err) {
				return nil, err
			}
			if s, ok := quarantineStep(m.cfg.Job, d); ok {
				whole[s] = true
			}
			continue
		}
		if rec.BlobDir != "" {
			needed[rec.BlobDir] = true
		}
		for _, n := range rec.Nodes {
			if err := m.markChain(ctx, n.Manifest, needed); err != nil {
				return nil, err
			}
		}
	}
	return whole, nil
}

// TempRemover is a Storage that can remove the invisible temporary data of writers that never
// finished (a process killed in the middle of a persist). FSStorage implements it.
type TempRemover interface {
	// RemoveTemp removes the temporary data under prefix last modified before cutoff and returns
	// how many objects' worth it removed.
	RemoveTemp(ctx context.Context, prefix string, cutoff time.Time) (int, error)
}

// CleanResult reports what Clean removed.
type CleanResult struct {
	PruneResult
	// Temporary counts the temporary files of unfinished writes removed.
	Temporary int
}

// Clean removes what no commit can ever restore: it applies retention as Prune does and also
// deletes persists newer than the newest commit that no commit needs (a generation persisted but
// never committed, by a process that died or a job that stopped first), and the temporary data of
// writes that never finished, when the Storage is a TempRemover. Quarantined commits are kept.
// Call it only while no node of the job persists — at the job's start, before its first
// snapshot — since a persist in progress would lose its objects.
func (m *Committer) Clean(ctx context.Context) (CleanResult, error) {
	var res CleanResult
	if tr, ok := m.cfg.Storage.(TempRemover); ok {
		n, err := tr.RemoveTemp(ctx, m.cfg.Job+"/", time.Now())
		res.Temporary = n
		if err != nil {
			return res, fmt.Errorf("checkpoint: clean: %w", err)
		}
	}
	pr, err := m.prune(ctx, true)
	res.PruneResult = pr
	m.mu.Lock()
	m.stats.PrunedCommits += uint64(len(pr.DeletedCommits))
	m.stats.PrunedObjects += uint64(pr.DeletedObjects)
	m.mu.Unlock()
	if err != nil {
		return res, fmt.Errorf("checkpoint: clean: %w", err)
	}
	return res, nil
}
