package train

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The shared-memory directory a run chose is recorded with its checkpoints, so a resume uses it
// even where the default would now be another (the default depends on free space), and a fresh
// run learns where the regions of the earlier one are.
func TestShmDirIsRecorded(t *testing.T) {
	cfg := Config{CheckpointDir: t.TempDir()}
	dir, prev, err := placeShm(&cfg, "")
	require.NoError(t, err)
	assert.Equal(t, defaultShmDir(cfg.CheckpointDir), dir)
	assert.Empty(t, prev)

	elsewhere := t.TempDir() // where an earlier run put its regions
	require.NoError(t, os.WriteFile(shmRecordPath(cfg.CheckpointDir, ""), []byte(elsewhere+"\n"), 0o600))
	cfg.Resume = true
	dir, prev, err = placeShm(&cfg, "")
	require.NoError(t, err)
	assert.Equal(t, elsewhere, dir, "a resume uses the recorded directory")
	assert.Empty(t, prev)

	cfg.Resume = false
	dir, prev, err = placeShm(&cfg, "")
	require.NoError(t, err)
	assert.Equal(t, defaultShmDir(cfg.CheckpointDir), dir)
	assert.Equal(t, elsewhere, prev, "a fresh run deletes the regions the record points to")
	again, prev, err := placeShm(&cfg, "")
	require.NoError(t, err)
	assert.Equal(t, dir, again)
	assert.Empty(t, prev, "recorded now")

	cfg.ShmDir = elsewhere
	dir, _, err = placeShm(&cfg, "ps-1")
	require.NoError(t, err)
	assert.Equal(t, elsewhere, dir, "a configured directory wins")
	b, err := os.ReadFile(shmRecordPath(cfg.CheckpointDir, "ps-1"))
	require.NoError(t, err)
	assert.Equal(t, elsewhere+"\n", string(b), "each server of a multi-process job has its own record")
}

func regions(t *testing.T, shmDir string) []string {
	t.Helper()
	nodes, err := regionNodes(shmDir)
	require.NoError(t, err)
	return nodes
}

// Regions of servers an earlier run had and a later one has not are deleted: by a fresh run at
// once, by a resumed one (whose restore may read them) once it has committed a checkpoint.
func TestRegionsOfRemovedServersAreDeleted(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainRecords, cfg.Servers, cfg.KeepShm, cfg.CheckpointEvery = 2048, 3, true, 4
	ctx := context.Background()
	_, err := Run(ctx, cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"ps-0", "ps-1", "ps-2"}, regions(t, cfg.ShmDir), "kept")

	resumed := cfg
	resumed.Servers, resumed.Resume, resumed.Epochs = 2, true, 2
	s, err := Run(ctx, resumed)
	require.NoError(t, err)
	require.Positive(t, s.Checkpoints.Committed)
	assert.Equal(t, []string{"ps-0", "ps-1"}, regions(t, cfg.ShmDir), "ps-2's region went with the resumed run's first commit")

	cfg.Servers, cfg.Overwrite = 3, true // start afresh over the checkpoints of the runs above
	_, err = Run(ctx, cfg)
	require.NoError(t, err)
	fresh := cfg
	fresh.Servers, fresh.KeepShm = 1, false
	_, err = Run(ctx, fresh)
	require.NoError(t, err)
	assert.Empty(t, regions(t, cfg.ShmDir), "a run that keeps nothing leaves nothing")
}

// When the checkpointer of one server cannot be opened, the regions already created for the
// others are deleted again.
func TestFailedOpenLeavesNoRegion(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Servers, cfg.Resume = 2, true

	// Another live process holds ps-1's region.
	st, err := checkpoint.NewFSStorage(t.TempDir())
	require.NoError(t, err)
	holder, err := checkpoint.New(checkpoint.Config{Job: jobName, Node: "ps-1", Storage: st, Slots: ps.DefaultSlots, ShmDir: cfg.ShmDir})
	require.NoError(t, err)
	defer holder.Close()

	_, err = Run(context.Background(), cfg)
	require.ErrorIs(t, err, checkpoint.ErrRegionLocked)
	assert.Equal(t, []string{"ps-1"}, regions(t, cfg.ShmDir), "only the other process's region remains")
	_, err = os.Stat(filepath.Join(cfg.ShmDir, jobName, "ps-0"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func tinyConfig(t *testing.T) Config {
	return Config{
		Synth: model.SynthConfig{DenseFeatures: 2, Vocab: []int{10, 100}}, TrainRecords: 512, TestRecords: 100,
		EmbeddingDim: 4, BottomHidden: []int{4}, TopHidden: []int{4}, BatchSize: 64, ShardSize: 128,
		Servers: 1, Workers: 1, EvalEvery: -1, CheckpointDir: t.TempDir(), ShmDir: t.TempDir(),
	}
}
