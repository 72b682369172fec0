package train

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loopbackAddr returns a loopback address whose port was free a moment ago.
func loopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// commitNames lists the commit records in a checkpoint directory.
func commitNames(t *testing.T, dir string) []string {
	t.Helper()
	st, err := checkpoint.NewFSStorage(dir)
	require.NoError(t, err)
	names, err := st.List(context.Background(), jobName+"/commits/")
	require.NoError(t, err)
	return names
}

// A run without Resume refuses a directory holding an earlier run's commits and deletes
// nothing; with Overwrite it starts afresh.
func TestFreshStartRefusesAnEarlierRunsCommits(t *testing.T) {
	ctx := context.Background()
	cfg := tinyConfig(t)
	cfg.CheckpointEvery = 3
	_, err := Run(ctx, cfg)
	require.NoError(t, err)
	before := commitNames(t, cfg.CheckpointDir)
	require.NotEmpty(t, before)

	_, err = Run(ctx, cfg)
	require.ErrorIs(t, err, ErrCheckpointsExist)
	require.ErrorIs(t, err, checkpoint.ErrExistingCommits, "the library's refusal")
	assert.Contains(t, err.Error(), cfg.CheckpointDir)
	assert.Contains(t, err.Error(), fmt.Sprintf("holds %d commits", len(before)))
	assert.Equal(t, before, commitNames(t, cfg.CheckpointDir), "a refused start deleted commits")

	cfg.Overwrite = true
	sum, err := Run(ctx, cfg)
	require.NoError(t, err)
	assert.False(t, sum.Resumed)
	assert.Positive(t, sum.Checkpoints.Committed)
}

// A coordinator taking over finds no servers running here, but a parameter server is never the
// one to delete commits, whatever its flags.
func TestParameterServerNeverDeletesCommits(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.CheckpointEvery = 3
	_, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	before := commitNames(t, cfg.CheckpointDir)
	require.NotEmpty(t, before)

	cfg.Overwrite = true
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // set up, then stop at once
	addr := loopbackAddr(t)
	rc := RoleConfig{Config: cfg, ID: "ps-0", Listen: addr, PS: []ps.Node{{ID: "ps-0", Addr: addr}},
		Secret: []byte("0123456789abcdef0123456789abcdef")}
	require.NoError(t, RunServer(ctx, rc))
	assert.Equal(t, before, commitNames(t, cfg.CheckpointDir))
}

// A run whose final checkpoint fails ends in an error that says which step a resume restores.
func TestFinalCheckpointFailureIsAnError(t *testing.T) {
	cfg := tinyConfig(t) // 8 steps: periodic checkpoints at 3 and 6, the final one at 8
	cfg.CheckpointEvery = 3
	var blocked string
	cfg.OnEvent = func(ev Event) {
		if ev.Kind == EventNote && strings.HasPrefix(ev.Message, "training stopped") {
			// The final checkpoint's directory cannot be made: a file has its name.
			blocked = filepath.Join(cfg.CheckpointDir, jobName, "data", fmt.Sprintf("%020d", ev.Progress.Steps))
			require.NoError(t, os.MkdirAll(filepath.Dir(blocked), 0o755))
			require.NoError(t, os.WriteFile(blocked, []byte("in the way"), 0o644))
		}
	}
	sum, err := Run(context.Background(), cfg)
	require.NotEmpty(t, blocked)
	require.ErrorIs(t, err, ErrNotCommitted)
	require.NotNil(t, sum)
	last := sum.Checkpoints.LastCommitted
	require.Positive(t, last)
	require.Less(t, last, uint64(sum.Steps))
	assert.Contains(t, err.Error(), fmt.Sprintf("a resume would restore step %d", last))
	assert.Contains(t, err.Error(), fmt.Sprintf("step %d", sum.Steps))
}

func TestCheckCommitted(t *testing.T) {
	assert.NoError(t, checkCommitted(elastic.Status{Step: 8, LastCommit: 8}, nil))
	err := checkCommitted(elastic.Status{Step: 8, LastCommit: 6}, nil)
	require.ErrorIs(t, err, ErrNotCommitted)
	assert.Contains(t, err.Error(), "a resume would restore step 6")
	boom := errors.New("disk full")
	err = checkCommitted(elastic.Status{Step: 8, LastCommit: 8}, boom)
	require.ErrorIs(t, err, boom)
	require.ErrorIs(t, err, ErrNotCommitted)
	err = checkCommitted(elastic.Status{Step: 5}, boom)
	assert.Contains(t, err.Error(), "a resume would find no checkpoint")
}

// A resume that skips a damaged commit says so (which commit, which file, what failed) and
// moves it aside; what no commit restores is cleaned.
func TestResumeWarnsAboutASkippedCommit(t *testing.T) {
	ctx := context.Background()
	cfg := tinyConfig(t)
	cfg.CheckpointEvery = 3
	_, err := Run(ctx, cfg)
	require.NoError(t, err)
	commits := commitNames(t, cfg.CheckpointDir)
	newest := filepath.Base(commits[len(commits)-1])
	chunks, err := filepath.Glob(filepath.Join(cfg.CheckpointDir, jobName, "data", newest, "ps-0", "*", "t0-*"))
	require.NoError(t, err)
	require.NotEmpty(t, chunks)
	b, err := os.ReadFile(chunks[0])
	require.NoError(t, err)
	b[len(b)/2] ^= 0x10
	require.NoError(t, os.WriteFile(chunks[0], b, 0o644))
	// A persist killed halfway left a temporary file.
	tmp := filepath.Join(filepath.Dir(chunks[0]), ".tmp-t1-s0-p0-99")
	require.NoError(t, os.WriteFile(tmp, []byte("half"), 0o644))

	var warnings []string
	cfg.Resume = true
	cfg.OnEvent = func(ev Event) {
		if ev.Kind == EventWarning {
			warnings = append(warnings, ev.Message)
		}
	}
	sum, err := Run(ctx, cfg)
	require.NoError(t, err)
	require.Len(t, warnings, 1)
	w := warnings[0]
	step := strings.TrimLeft(newest, "0")
	assert.Contains(t, w, "commit of step "+step)
	assert.Contains(t, w, filepath.Base(chunks[0]), "names the damaged file")
	assert.Contains(t, w, "checksum")
	assert.Contains(t, w, "moved aside to "+filepath.Join(cfg.CheckpointDir, jobName, "quarantine", newest))
	n, err := strconv.ParseUint(step, 10, 64)
	require.NoError(t, err)
	assert.Less(t, sum.ResumedStep, n, "resumed from the commit before the damaged one")
	q, err := filepath.Glob(filepath.Join(cfg.CheckpointDir, jobName, "quarantine", newest+"-*", "commit"))
	require.NoError(t, err)
	assert.Len(t, q, 1)
	_, err = os.Stat(tmp)
	assert.ErrorIs(t, err, os.ErrNotExist, "the temporary file of a killed persist is left")
}

// A parameter server process that moves to another shared-memory directory removes its region
// from the default one it used before, and leaves no empty directory there.
func TestServerLeavesNoEmptySharedMemoryDirectory(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.ShmDir, cfg.KeepShm = "", true
	def := defaultShmDir(cfg.CheckpointDir)
	t.Cleanup(func() { os.RemoveAll(def) })
	addr := loopbackAddr(t)
	rc := RoleConfig{Config: cfg, ID: "ps-0", Listen: addr, PS: []ps.Node{{ID: "ps-0", Addr: addr}},
		Secret: []byte("0123456789abcdef0123456789abcdef")}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // set up, then stop at once
	require.NoError(t, RunServer(ctx, rc))
	require.DirExists(t, filepath.Join(def, jobName, "ps-0"), "-keep-shm keeps the region")

	rc.ShmDir, rc.KeepShm = t.TempDir(), false
	require.NoError(t, RunServer(ctx, rc))
	assert.NoDirExists(t, def, "the default shared-memory directory used before is left behind")
}
