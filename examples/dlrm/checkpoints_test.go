package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const tinyRun = "-train-records 3000 -test-records 2000 -duration 0 -dim 4 -bottom 8 -top 8 -batch 100 -checkpoint-every 10 -eval-every 0"

// A second run in a checkpoint directory it names, which holds the first run's commits, is
// refused, says why and what to do, and deletes nothing; -overwrite starts afresh. (A run that
// names none gets a directory of its own: TestDefaultCheckpointDirIsEachRunsOwn.)
func TestSecondRunInANamedDirectoryIsRefusedWithAnExplanation(t *testing.T) {
	ckDir := t.TempDir()
	args := strings.Fields(tinyRun + " -checkpoint-dir " + ckDir + " -shm-dir " + t.TempDir())
	var out, errs bytes.Buffer
	require.Equal(t, 0, run(args, &out, &errs), errs.String())
	before, err := filepath.Glob(filepath.Join(ckDir, "dlrm", "commits", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, before)

	out.Reset()
	errs.Reset()
	require.Equal(t, 1, run(args, &out, &errs))
	msg := errs.String()
	for _, want := range []string{ckDir, "holds", "-resume", "-overwrite", "another -checkpoint-dir"} {
		assert.Contains(t, msg, want)
	}
	after, err := filepath.Glob(filepath.Join(ckDir, "dlrm", "commits", "*"))
	require.NoError(t, err)
	assert.Equal(t, before, after, "a refused run deleted commits")

	errs.Reset()
	require.Equal(t, 0, run(append(args, "-overwrite"), &out, &errs), errs.String())
	_, err = parseFlags(strings.Fields("-resume -overwrite"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "-overwrite")
}

// A resume that skips a damaged commit says so on stderr without -v.
func TestResumeReportsASkippedCommitOnStderr(t *testing.T) {
	ckDir := t.TempDir()
	args := strings.Fields(tinyRun + " -checkpoint-dir " + ckDir + " -shm-dir " + t.TempDir())
	var out, errs bytes.Buffer
	require.Equal(t, 0, run(args, &out, &errs), errs.String())
	commits, err := filepath.Glob(filepath.Join(ckDir, "dlrm", "commits", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, commits)
	newest := filepath.Base(commits[len(commits)-1])
	chunks, err := filepath.Glob(filepath.Join(ckDir, "dlrm", "data", newest, "*", "*", "t0-*"))
	require.NoError(t, err)
	require.NotEmpty(t, chunks)
	b, err := os.ReadFile(chunks[0])
	require.NoError(t, err)
	b[len(b)/2] ^= 1
	require.NoError(t, os.WriteFile(chunks[0], b, 0o644))

	errs.Reset()
	require.Equal(t, 0, run(append(args, "-resume"), &out, &errs), errs.String())
	msg := errs.String()
	assert.Contains(t, msg, "dlrm: warning: resume skipped the commit of step "+strings.TrimLeft(newest, "0"))
	assert.Contains(t, msg, filepath.Base(chunks[0]))
	assert.Contains(t, msg, filepath.Join(ckDir, "dlrm", "quarantine", newest))
}

// An evaluation says it evaluates, not that it trains for -duration.
func TestEvaluateSaysWhatItDoes(t *testing.T) {
	ckDir := t.TempDir()
	args := strings.Fields(tinyRun + " -checkpoint-dir " + ckDir + " -shm-dir " + t.TempDir())
	var out, errs bytes.Buffer
	require.Equal(t, 0, run(args, &out, &errs), errs.String())
	assert.Contains(t, out.String(), "dlrm: training until the epochs are done", "-duration 0")

	out.Reset()
	require.Equal(t, 0, run(append(args, "-evaluate", "newest", "-duration", "1m"), &out, &errs), errs.String())
	assert.NotContains(t, out.String(), "training for")
	assert.Contains(t, out.String(), "dlrm: evaluating the newest commit of "+ckDir)
}
