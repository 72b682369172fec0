package train

import (
	"context"
	"crypto/sha256"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
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
	def := defaultShmDir(cfg.CheckpointDir)
	t.Cleanup(func() { os.RemoveAll(def) })
	place, prev, err := placeShm(&cfg, "")
	require.NoError(t, err)
	assert.Equal(t, shmPlace{dir: def, own: true}, place)
	assert.Empty(t, prev)

	elsewhere := t.TempDir() // a directory of the user's
	cfg.ShmDir = elsewhere
	place, prev, err = placeShm(&cfg, "")
	require.NoError(t, err)
	assert.Equal(t, shmPlace{dir: elsewhere}, place, "a configured directory wins; the run did not make it")
	assert.Equal(t, def, prev, "a run in another directory deletes the regions the record pointed to")

	cfg.ShmDir, cfg.Resume = "", true
	place, prev, err = placeShm(&cfg, "")
	require.NoError(t, err)
	assert.Equal(t, elsewhere, place.dir, "a resume uses the recorded directory")
	assert.Empty(t, prev)

	cfg.Resume = false
	place, prev, err = placeShm(&cfg, "")
	require.NoError(t, err)
	assert.Equal(t, def, place.dir)
	assert.Equal(t, elsewhere, prev)
	again, prev, err := placeShm(&cfg, "")
	require.NoError(t, err)
	assert.Equal(t, place, again)
	assert.Empty(t, prev, "recorded now")

	made := filepath.Join(t.TempDir(), "made")
	cfg.ShmDir = made
	place, _, err = placeShm(&cfg, "ps-1")
	require.NoError(t, err)
	assert.Equal(t, shmPlace{dir: made, own: true}, place, "a directory the run makes is the run's to remove")
	rec, ok, err := readShmRecord(shmRecordPath(cfg.CheckpointDir, "ps-1"))
	require.NoError(t, err)
	require.True(t, ok, "each server of a multi-process job has its own record")
	assert.Equal(t, shmRecord{Dir: made, CheckpointDir: cfg.CheckpointDir}, rec)
	cfg.ShmDir, cfg.Resume = "", true
	place, _, err = placeShm(&cfg, "ps-1")
	require.NoError(t, err)
	assert.Equal(t, shmPlace{dir: made, own: true}, place, "a resume knows the directory was made by a run of its checkpoints")
	tidyShm(place.dir, place.own)
	assert.NoDirExists(t, made, "removed once empty")
}

// A record of the first format names no checkpoint directory: a resume does not take it for its
// own, and a fresh run deletes nothing there.
func TestShmRecordWithoutOwnerIsNotUsed(t *testing.T) {
	cfg := Config{CheckpointDir: t.TempDir(), Resume: true}
	def := defaultShmDir(cfg.CheckpointDir)
	t.Cleanup(func() { os.RemoveAll(def) })
	elsewhere := t.TempDir()
	require.NoError(t, os.WriteFile(shmRecordPath(cfg.CheckpointDir, ""), []byte(elsewhere+"\n"), 0o600))
	place, prev, err := placeShm(&cfg, "")
	require.NoError(t, err)
	assert.Equal(t, def, place.dir)
	assert.Empty(t, prev)
}

// shmFiles returns every file under dir with the digest of its contents.
func shmFiles(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	out := map[string][32]byte{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[p] = sha256.Sum256(b)
		return nil
	}))
	return out
}

// changedShm returns the files of before that are gone or changed under dir.
func changedShm(t *testing.T, dir string, before map[string][32]byte) []string {
	t.Helper()
	after := shmFiles(t, dir)
	var out []string
	for name, sum := range before {
		if now, ok := after[name]; !ok || now != sum {
			rel, _ := filepath.Rel(dir, name)
			out = append(out, rel)
		}
	}
	slices.Sort(out)
	return out
}

// A copy of a checkpoint directory carries the original's record of its shared memory. A run
// resumed in the copy neither reads, writes nor deletes the original's regions (it used to
// take them for its own, and delete them at its end); one told to use the original's
// directory is refused. The original then resumes from its shared memory as before.
func TestResumingACopyKeepsTheOriginalsSharedMemory(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "elasticps-dlrm-test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(shm) })
	ctx := context.Background()
	orig := tinyConfig(t)
	orig.Servers, orig.CheckpointEvery, orig.KeepShm, orig.ShmDir = 2, 3, true, shm
	_, err = Run(ctx, orig)
	require.NoError(t, err)
	before := shmFiles(t, shm)
	require.Equal(t, []string{"ps-0", "ps-1"}, regions(t, shm))

	cp := orig
	cp.CheckpointDir = filepath.Join(t.TempDir(), "copy")
	require.NoError(t, os.CopyFS(cp.CheckpointDir, os.DirFS(orig.CheckpointDir)))
	t.Cleanup(func() { os.RemoveAll(defaultShmDir(cp.CheckpointDir)) })
	cp.ShmDir, cp.KeepShm, cp.Resume, cp.Epochs = "", false, true, 2
	s, err := Run(ctx, cp)
	require.NoError(t, err)
	assert.True(t, s.Resumed)
	assert.NotContains(t, s.ResumedFrom, "shm", "the copy restored from the original's shared memory")
	assert.NotEqual(t, shm, s.Checkpoints.ShmDir)
	assert.Empty(t, changedShm(t, shm, before), "of the original's %d shared-memory files, these went or changed", len(before))

	cp.ShmDir = shm
	_, err = Run(ctx, cp)
	require.ErrorIs(t, err, ErrConfig)
	assert.ErrorContains(t, err, orig.CheckpointDir, "names the checkpoints the directory belongs to")
	assert.Empty(t, changedShm(t, shm, before))

	orig.Resume, orig.ShmDir, orig.Epochs = true, "", 2
	s, err = Run(ctx, orig)
	require.NoError(t, err)
	assert.Equal(t, "ps-0: shm, ps-1: shm", s.ResumedFrom, "the original restores from its shared memory")
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

// A run leaves no shared-memory directory of its own behind: a ShmDir it made goes with the
// last of its regions (at its end, or at the end of a resume after one that kept them), while a
// directory that was there before stays, emptied of the job.
func TestRunLeavesNoEmptySharedMemoryDirectory(t *testing.T) {
	ctx := context.Background()
	cfg := tinyConfig(t)
	parent := t.TempDir()
	made := filepath.Join(parent, "made")
	cfg.ShmDir, cfg.CheckpointEvery = made, 3
	_, err := Run(ctx, cfg)
	require.NoError(t, err)
	assert.NoDirExists(t, made)

	cfg.KeepShm, cfg.Overwrite = true, true
	_, err = Run(ctx, cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"ps-0"}, regions(t, made), "kept")
	cfg.KeepShm, cfg.Overwrite, cfg.Resume, cfg.Epochs = false, false, true, 2
	_, err = Run(ctx, cfg)
	require.NoError(t, err)
	assert.NoDirExists(t, made, "the resumed run removes the directory the first one made")

	cfg.ShmDir, cfg.Overwrite, cfg.Resume, cfg.Epochs = parent, true, false, 1
	_, err = Run(ctx, cfg)
	require.NoError(t, err)
	entries, err := os.ReadDir(parent)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing of the job is left in the user's directory")
	assert.DirExists(t, parent, "a directory the run did not make stays")
}
