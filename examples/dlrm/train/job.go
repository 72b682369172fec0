package train

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
)

// jobName names the training job in checkpoint storage and shared memory.
const jobName = "dlrm"

// embPrefix starts the server-side name of every embedding table (one per sparse field).
const embPrefix = "emb."

// biasPrefix starts the server-side name of every first-order table (Config.FirstOrder): one
// scalar per id of a sparse field.
const biasPrefix = "bias."

// sparseTables names the server-side tables of the sparse fields: one embedding table per field
// and, with first-order terms, one table of scalars per field (nil without).
type sparseTables struct {
	emb, bias []string
}

func newSparseTables(fields []string, firstOrder bool) sparseTables {
	var t sparseTables
	for _, f := range fields {
		t.emb = append(t.emb, embPrefix+f)
		if firstOrder {
			t.bias = append(t.bias, biasPrefix+f)
		}
	}
	return t
}

// tableSpecs returns the sparse tables of the model (cfg with defaults filled in): an embedding
// table per field, each seeded differently so that equal ids of two fields start from different
// rows, and with first-order terms a table of scalars per field, every id's starting at 0.
func tableSpecs(cfg *Config, fields []string) []ps.TableSpec {
	var specs []ps.TableSpec
	opt := cfg.embeddingOptimizer()
	for f, name := range fields {
		specs = append(specs, ps.TableSpec{Name: embPrefix + name, Config: embedding.Config{
			Name: embPrefix + name, Dim: cfg.EmbeddingDim, Seed: cfg.Seed + uint64(f+1)*0x9e3779b97f4a7c15,
			Optimizer: opt, Init: embedding.Init{Kind: embedding.InitUniform, Scale: cfg.EmbeddingInit},
		}})
	}
	if cfg.firstOrder() {
		for _, name := range fields {
			specs = append(specs, ps.TableSpec{Name: biasPrefix + name, Config: embedding.Config{
				Name: biasPrefix + name, Dim: 1, Optimizer: opt, Init: embedding.Init{Kind: embedding.InitZeros},
			}})
		}
	}
	return specs
}

// CheckpointStats are the checkpoint figures of a run.
type CheckpointStats struct {
	Dir    string // storage directory
	ShmDir string // shared-memory tier
	// Taken counts snapshots (Full of them full), Committed those committed, Skipped those not
	// taken because a server's generations were both still being persisted, Failed those that
	// failed otherwise.
	Taken, Full, Committed, Skipped, Failed int
	LastCommitted                           uint64 // step of the newest commit
	// TotalBlocked and MaxBlocked are the time training waited at checkpoint barriers: for the
	// batches in hand to finish and for every server's copy into shared memory.
	TotalBlocked, MaxBlocked time.Duration
	Copied                   int64 // bytes copied into shared memory
	Stored                   int64 // bytes written to storage (compressed)
	// MaxPersist is the longest time from a snapshot to its commit.
	MaxPersist time.Duration
}

// MeanBlocked returns the mean blocking time of a snapshot.
func (s CheckpointStats) MeanBlocked() time.Duration {
	if s.Taken == 0 {
		return 0
	}
	return s.TotalBlocked / time.Duration(s.Taken)
}

// CheckpointEvent describes one snapshot or one commit.
type CheckpointEvent struct {
	Step    uint64
	Full    bool
	Bytes   int64         // copied into shared memory (snapshot)
	Blocked time.Duration // training paused (snapshot)
	Persist time.Duration // from snapshot to commit (commit)
	Err     error         // a failed snapshot or commit
	Skipped bool          // a snapshot not taken: a server's generations were both busy
	// Applied is, for a snapshot of an embedded run, the size of the servers' records of the
	// batches they applied (saved with it), summed, right after it; 0 in a role of a
	// multi-process job.
	Applied int64
}

// ckStats gathers the checkpoint figures from the coordinator's events.
type ckStats struct {
	mu sync.Mutex
	s  CheckpointStats
}

// record counts ev and returns it as the trainer reports it.
func (c *ckStats) record(ev elastic.CheckpointEvent) CheckpointEvent {
	out := CheckpointEvent{Step: ev.Step, Full: ev.Full, Bytes: ev.Bytes, Blocked: ev.Blocked, Persist: ev.Persist, Err: ev.Err}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case ev.Commit && ev.Err == nil:
		c.s.Committed++
		c.s.LastCommitted = max(c.s.LastCommitted, ev.Step)
		c.s.MaxPersist = max(c.s.MaxPersist, ev.Persist)
	case ev.Commit:
		c.s.Failed++
	case errors.Is(ev.Err, checkpoint.ErrBusy), errors.Is(ev.Err, elastic.ErrCommitsBehind):
		c.s.Skipped++
		out.Skipped = true
	case ev.Err != nil:
		c.s.Failed++
	default:
		c.s.Taken++
		if ev.Full {
			c.s.Full++
		}
		c.s.Copied += ev.Bytes
		c.s.TotalBlocked += ev.Blocked
		c.s.MaxBlocked = max(c.s.MaxBlocked, ev.Blocked)
	}
	return out
}

func (c *ckStats) get() CheckpointStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s
}

// ErrCheckpointsExist is returned by Run and RunCoordinator without Resume or Overwrite when the
// checkpoint directory holds commits of an earlier run: starting over would delete them. The
// error wraps checkpoint.ErrExistingCommits too.
var ErrCheckpointsExist = errors.New("train: checkpoints of an earlier run")

// openStorage opens the checkpoint directory for the job's coordinator. Without resume, a
// directory holding the job's commits is refused unless Overwrite, which deletes them
// (checkpoint.Committer.PrepareFresh, before the servers and their shared memory are touched); what no commit
// can restore (persists never committed, temporary files of a killed persist) goes either way.
// (A resume cleans in the coordinator's Resume, once it knows the servers are fresh.)
func openStorage(ctx context.Context, cfg *Config, logger *slog.Logger) (*checkpoint.FSStorage, error) {
	st, err := checkpoint.NewFSStorage(cfg.CheckpointDir)
	if err != nil {
		return nil, err
	}
	if cfg.Resume || cfg.Evaluate != "" {
		return st, nil
	}
	m, err := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: jobName, Storage: st, KeepLast: -1, Logger: logger})
	if err != nil {
		return nil, err
	}
	err = m.PrepareFresh(ctx, cfg.Overwrite)
	if existing := (*checkpoint.ExistingCommitsError)(nil); errors.As(err, &existing) {
		return nil, fmt.Errorf("%w: %s holds %d commits, the newest of step %d (%w)", ErrCheckpointsExist, st.Root(), existing.Commits, existing.Newest, checkpoint.ErrExistingCommits)
	}
	if err != nil {
		return nil, err
	}
	if _, err := m.Clean(ctx); err != nil {
		return nil, err
	}
	return st, nil
}

// ErrNotCommitted is returned by Run and RunCoordinator, with the summary, when the run ends with
// trained steps no commit holds: the final checkpoint failed (or was skipped). The message says
// which step a resume would restore.
var ErrNotCommitted = errors.New("train: the last trained steps are not committed")

// checkCommitted returns nil when the newest commit holds every step trained, else an error
// wrapping ErrNotCommitted (and finishErr, the final checkpoint's failure, if any) that says
// which step a resume restores.
func checkCommitted(st elastic.Status, finishErr error) error {
	if finishErr == nil && st.LastCommit >= st.Step {
		return nil
	}
	restores := fmt.Sprintf("a resume would restore step %d", st.LastCommit)
	if st.LastCommit == 0 {
		restores = "a resume would find no checkpoint"
	}
	if finishErr != nil {
		return fmt.Errorf("%w: %w; training reached step %d and %s", ErrNotCommitted, finishErr, st.Step, restores)
	}
	return fmt.Errorf("%w: training reached step %d but the newest commit is of step %d; %s", ErrNotCommitted, st.Step, st.LastCommit, restores)
}

// prepareShm chooses the shared-memory directory of the run's servers (node "" for an embedded
// run, the server's id for a parameter server process) and deletes what no run would read again:
// regions an earlier run of this checkpoint directory kept elsewhere (and that directory, when
// one of its runs made it and it is left empty), and, for an embedded run without resume,
// every region of the job there. A parameter server process is not its job's coordinator, so it
// keeps its region: it holds the copies of the job's commits that a restore on this host reads
// first. Regions another checkpoint directory refers to (this one being a copy of it) are never
// used nor deleted.
func prepareShm(cfg *Config, node string, logger *slog.Logger) (shmPlace, error) {
	place, prev, err := placeShm(cfg, node)
	if err != nil {
		return shmPlace{}, err
	}
	if prev != "" {
		keep := func(n string) bool { return node != "" && n != node }
		if err := deleteRegions(prev, keep, false); err != nil {
			logger.Warn("shared memory of an earlier run left behind", "dir", prev, "err", err)
		}
		o, _ := readShmOwner(prev)
		tidyShm(prev, o.Created || isDefaultShmDir(prev, cfg.CheckpointDir))
	}
	if !cfg.Resume && node == "" {
		if err := deleteRegions(place.dir, nil, false); err != nil {
			return shmPlace{}, err
		}
	}
	return place, nil
}

// removeShm deletes the regions of place (of every node, or of those keep rejects) and, once
// none is left, the directories the run may remove (tidyShm).
func removeShm(place shmPlace, keep func(node string) bool) error {
	err := deleteRegions(place.dir, keep, false)
	tidyShm(place.dir, place.own)
	if err != nil {
		return fmt.Errorf("shared memory: %w", err)
	}
	return nil
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
