package elastic

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/elasticps/elasticps/checkpoint"
)

// ExistingCommitsError is the refusal to train a job afresh over the commits of an earlier run
// of it; errors.Is(err, ErrExistingCommits) holds.
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

// PrepareFresh readies st for a run of job that starts afresh rather than resuming. When st
// holds no commit record of the job it does nothing. Otherwise, without overwrite, it returns an
// *ExistingCommitsError and deletes nothing; with overwrite, it deletes every object of the job
// in st (checkpoint's Committer.DeleteAll: commits, their data, the coordinators' claims, the
// quarantined commits) and logs how many. A Coordinator does the same in NewCoordinator
// (Config.Overwrite); a program calls it to refuse before it starts anything else (its
// processes, its shared memory), and must call it while nothing of the job persists or commits.
// log may be nil.
func PrepareFresh(ctx context.Context, st checkpoint.Storage, job string, overwrite bool, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	m, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: job, Storage: st, KeepLast: -1, Logger: log})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return prepareFresh(ctx, m, job, overwrite, log)
}

func prepareFresh(ctx context.Context, m *checkpoint.Committer, job string, overwrite bool, log *slog.Logger) error {
	records, err := m.Records(ctx)
	if err != nil {
		return fmt.Errorf("elastic: look for earlier commits: %w", err)
	}
	if len(records) == 0 {
		return nil
	}
	existing := &ExistingCommitsError{Job: job, Commits: len(records), Newest: records[0]}
	if !overwrite {
		return existing
	}
	n, err := m.DeleteAll(ctx)
	if err != nil {
		return fmt.Errorf("elastic: overwrite the earlier run (%d commits, the newest of step %d): %w", existing.Commits, existing.Newest, err)
	}
	log.Info("deleted the checkpoints of an earlier run to start afresh", "job", job, "commits", existing.Commits, "newest", existing.Newest, "objects", n)
	return nil
}
