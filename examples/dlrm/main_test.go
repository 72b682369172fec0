package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFlagsDefaults(t *testing.T) {
	o, err := parseFlags(nil, &bytes.Buffer{})
	require.NoError(t, err)
	c := o.cfg
	assert.Equal(t, train.Synthetic, c.Data.Kind)
	assert.Equal(t, time.Minute, c.Duration, "the default run lasts about a minute")
	assert.Equal(t, 2, c.Servers)
	assert.Equal(t, 2, c.Workers)
	assert.Equal(t, []int{64, 32}, c.BottomHidden)
	assert.Equal(t, []int{128, 64}, c.TopHidden)
	assert.NotEmpty(t, c.CheckpointDir)
	assert.False(t, c.Resume)
}

func TestFlagsParse(t *testing.T) {
	o, err := parseFlags(strings.Fields("-data movielens:ml -bottom none -top 32 -emb-opt adam -emb-lr 0.01 -dense-opt SGD -ps 3 -workers 1 -duration 0 -checkpoint-every 0 -eval-every 0 -resume"), &bytes.Buffer{})
	require.NoError(t, err)
	c := o.cfg
	assert.Equal(t, train.DataSpec{Kind: train.MovieLens, Paths: []string{"ml"}}, c.Data)
	assert.Equal(t, []int{}, c.BottomHidden, "none: no hidden layer")
	assert.Equal(t, []int{32}, c.TopHidden)
	assert.Equal(t, embedding.Adam, c.EmbeddingOptimizer.Kind)
	assert.Equal(t, float32(0.01), c.EmbeddingOptimizer.LearningRate)
	assert.Equal(t, embedding.SGD, c.DenseOptimizer.Kind)
	assert.Equal(t, 3, c.Servers)
	assert.Equal(t, time.Duration(0), c.Duration)
	assert.Equal(t, -1, c.CheckpointEvery, "0 means only the final checkpoint")
	assert.Negative(t, c.EvalEvery, "0 means only the final evaluation")
	assert.True(t, c.Resume)
}

func TestFlagsReportEveryProblem(t *testing.T) {
	_, err := parseFlags(strings.Fields("-data parquet:x -bottom 64,x -top 0 -emb-opt lbfgs -emb-lr -1 -duration -1s -checkpoint-every -5"), &bytes.Buffer{})
	require.Error(t, err)
	for _, want := range []string{"-data", "unknown data kind", "-bottom", "-top", "-emb-opt", "lbfgs", "-emb-lr", "-duration", "-checkpoint-every"} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = parseFlags(strings.Fields("-workers 0 -batch -2"), &bytes.Buffer{})
	require.ErrorIs(t, err, train.ErrConfig)
	assert.Contains(t, err.Error(), "BatchSize")
	_, err = parseFlags([]string{"extra"}, &bytes.Buffer{})
	assert.ErrorContains(t, err, "unexpected arguments")
	_, err = parseFlags(strings.Fields("-data movielens:ml -test t.csv"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "held-out test files")
}

func TestRunPrintsSummaryWithoutTerminal(t *testing.T) {
	var out, errs bytes.Buffer
	code := run(strings.Fields("-train-records 3000 -test-records 2000 -duration 0 -dim 4 -bottom 8 -top 8 -batch 100 -checkpoint-every 10 -checkpoint-dir "+t.TempDir()), &out, &errs)
	require.Equal(t, 0, code, errs.String())
	s := out.String()
	for _, want := range []string{"checkpoint at step ", "committed", "summary (every epoch done)", "3000 samples", "exactly once: every position trained exactly once per epoch", "generator's hidden model"} {
		assert.Contains(t, s, want)
	}
	assert.NotContains(t, s, "\x1b[", "no terminal control codes when stdout is not a terminal")
}

func TestSyntheticShapeFlags(t *testing.T) {
	o, err := parseFlags(strings.Fields("-skew 1.3 -vocab-cap 500"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, 1.3, o.cfg.Synth.ZipfExponent)
	for _, v := range o.cfg.Synth.Vocab {
		assert.LessOrEqual(t, v, 500)
	}
	o, err = parseFlags(strings.Fields("-vocab-cap 0"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Nil(t, o.cfg.Synth.Vocab, "0 keeps the generator's own sizes")
	_, err = parseFlags(strings.Fields("-skew 0.9 -vocab-cap -1"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "-skew")
	assert.ErrorContains(t, err, "-vocab-cap")
}

func TestRecoveryFlag(t *testing.T) {
	o, err := parseFlags(nil, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, elastic.Rollback, o.cfg.Recovery)
	o, err = parseFlags(strings.Fields("-recovery partial -shm-dir /tmp/x"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, elastic.Partial, o.cfg.Recovery)
	assert.Equal(t, "/tmp/x", o.cfg.ShmDir)
	_, err = parseFlags(strings.Fields("-recovery sometimes"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "want rollback or partial")
}
