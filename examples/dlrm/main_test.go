package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
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
	assert.Equal(t, 10*time.Second, c.CheckpointInterval, "the first checkpoint within about ten seconds whatever the speed")
	assert.False(t, c.Resume)

	// train.CommandDefaults is what the flags default to (the directory aside).
	c.CheckpointDir = ""
	assert.Equal(t, train.CommandDefaults(), c)
}

func TestFlagsParse(t *testing.T) {
	o, err := parseFlags(strings.Fields("-data movielens:ml -bottom none -top 32 -emb-opt adam -emb-lr 0.01 -dense-opt SGD -ps 3 -workers 1 -duration 0 -checkpoint-every 0 -checkpoint-interval 0 -eval-every 0 -resume"), &bytes.Buffer{})
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
	assert.Equal(t, -1, c.CheckpointEvery, "0 means none by steps")
	assert.Negative(t, c.CheckpointInterval, "0 means none by time: with none by steps, only the final checkpoint")
	assert.Negative(t, c.EvalEvery, "0 means only the final evaluation")
	assert.True(t, c.Resume)
}

func TestFlagsReportEveryProblem(t *testing.T) {
	_, err := parseFlags(strings.Fields("-data parquet:x -bottom 64,x -top 0 -emb-opt lbfgs -emb-lr -1 -duration -1s -checkpoint-every -5 -checkpoint-interval -1s"), &bytes.Buffer{})
	require.Error(t, err)
	for _, want := range []string{"-data", "unknown data kind", "-bottom", "-top", "-emb-opt", "lbfgs", "-emb-lr", "-duration", "-checkpoint-every", "-checkpoint-interval"} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = parseFlags(strings.Fields("-workers 0 -batch -2"), &bytes.Buffer{})
	require.ErrorIs(t, err, train.ErrConfig)
	assert.Contains(t, err.Error(), "BatchSize")
	_, err = parseFlags([]string{"extra"}, &bytes.Buffer{})
	assert.ErrorContains(t, err, "unexpected arguments")
	_, err = parseFlags(strings.Fields("-data movielens:ml -test t.csv,u.csv"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "movielens takes one held-out path")
	_, err = parseFlags(strings.Fields("-test t.csv"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "held-out test files")
	o, err := parseFlags(strings.Fields("-data movielens:ml-100k/u1.base -test ml-100k/u1.test"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, []string{"ml-100k/u1.base"}, o.cfg.Data.Paths)
	assert.Equal(t, []string{"ml-100k/u1.test"}, o.cfg.TestFiles)
	assert.False(t, o.cfg.AllowOverlap)
	o, err = parseFlags(strings.Fields("-data movielens:ml-100k -test ml-100k/u1.test -allow-overlap"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.True(t, o.cfg.AllowOverlap)
}

func TestRunPrintsSummaryWithoutTerminal(t *testing.T) {
	var out, errs bytes.Buffer
	code := run(strings.Fields("-train-records 3000 -test-records 2000 -duration 0 -dim 4 -bottom 8 -top 8 -batch 100 -checkpoint-every 10 -checkpoint-dir "+t.TempDir()), &out, &errs)
	require.Equal(t, 0, code, errs.String())
	s := out.String()
	for _, want := range []string{"checkpoint at step ", "committed", "summary (every epoch done)", "3000 samples", "exactly once: every position of every epoch covered exactly once; 3000 positions covered, 3000 of them trained as samples", "generator's hidden model"} {
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

// TestRunFailsOnBadInput: a comma-separated file given as criteo fails with exit status 1 and the
// reason, instead of "training" nothing and printing the AUC of an untrained model.
func TestRunFailsOnBadInput(t *testing.T) {
	var b strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&b, "%d,%d,%d,68fd1e64\n", i%2, i, 3*i)
	}
	data := filepath.Join(t.TempDir(), "x.csv")
	require.NoError(t, os.WriteFile(data, []byte(b.String()), 0o600))
	var out, errs bytes.Buffer
	code := run(strings.Fields("-data criteo:"+data+" -duration 0 -checkpoint-dir "+t.TempDir()), &out, &errs)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs.String(), data+":1: no tab but commas")
	assert.NotContains(t, out.String(), "AUC")
}

// TestRunRefusesOverlap gives the training file as the test file: refused before training with
// exit status 1, the count and the first pairs; with -allow-overlap it trains and the summary
// gives the count.
func TestRunRefusesOverlap(t *testing.T) {
	var b strings.Builder
	for i := range 400 {
		fmt.Fprintf(&b, "%d %d:1 %d:1\n", i%2, 1+i%7, 100+i)
	}
	data := filepath.Join(t.TempDir(), "x.svm")
	require.NoError(t, os.WriteFile(data, []byte(b.String()), 0o600))
	args := "-data libsvm:" + data + " -test " + data + " -duration 0 -epochs 1 -dim 4 -bottom 4 -top 4 -checkpoint-dir "
	var out, errs bytes.Buffer
	code := run(strings.Fields(args+t.TempDir()), &out, &errs)
	assert.Equal(t, 1, code)
	assert.Contains(t, errs.String(), "400 of 400 test records also in the training data, e.g. "+data+":1 = "+data+":1, "+data+":2 = "+data+":2")
	assert.Contains(t, errs.String(), "-allow-overlap")
	assert.NotContains(t, out.String(), "AUC")

	out.Reset()
	errs.Reset()
	code = run(strings.Fields(args+t.TempDir()+" -allow-overlap"), &out, &errs)
	require.Equal(t, 0, code, errs.String())
	assert.Contains(t, out.String(), "overlap:     400 of 400 test records also in the training data")
	assert.Contains(t, out.String(), "AUC")
}

func TestFlagsInput(t *testing.T) {
	dir := t.TempDir()
	fm := filepath.Join(dir, "fields.txt")
	require.NoError(t, os.WriteFile(fm, []byte("user=0-999\nitem=1000-1999\n"), 0o600))
	o, err := parseFlags(strings.Fields("-data libsvm:x.svm -field-map "+fm+" -pooling mean -bad-lines fail -max-bad 2.5"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, "user=0-999\nitem=1000-1999\n", o.cfg.FieldMap, "a file of entries")
	assert.Equal(t, "mean", o.cfg.Pooling)
	assert.Equal(t, train.FailOnBadLine, o.cfg.BadLines)
	assert.InDelta(t, 0.025, o.cfg.MaxBadFraction, 1e-12)
	o, err = parseFlags(strings.Fields("-data libfm:x.ffm -fields 39"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, train.DataSpec{Kind: train.LibFM, Paths: []string{"x.ffm"}}, o.cfg.Data)
	assert.Equal(t, 39, o.cfg.Fields)
	assert.Equal(t, train.SkipBadLines, o.cfg.BadLines)
	assert.Equal(t, train.DefaultMaxBadFraction, o.cfg.MaxBadFraction)
	_, err = parseFlags(strings.Fields("-data criteo:x -field-map a=1-x -fields 3 -pooling max -bad-lines maybe -max-bad 101"), &bytes.Buffer{})
	require.Error(t, err)
	for _, want := range []string{"-bad-lines", "-max-bad"} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = parseFlags(strings.Fields("-data criteo:x -field-map a=1-x -fields 3 -pooling max"), &bytes.Buffer{})
	require.ErrorIs(t, err, train.ErrConfig)
	for _, want := range []string{"field map is for libsvm", "Fields 3", "Pooling \"max\""} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestFlagsRegularisationAndKeepBest(t *testing.T) {
	o, err := parseFlags(strings.Fields("-data movielens:ml -emb-l2 0.001 -dense-l2 none -early-stop 3"), &bytes.Buffer{})
	require.NoError(t, err)
	c := o.cfg
	assert.Equal(t, float32(0.001), c.EmbeddingOptimizer.L2)
	assert.Negative(t, c.DenseOptimizer.L2, "none")
	assert.Equal(t, 3, c.EarlyStop)
	assert.Equal(t, train.SwitchDefault, c.KeepBest)
	assert.Equal(t, train.MetricLogLoss, c.BestMetric, "log loss by default")
	o, err = parseFlags(strings.Fields("-keep-best -emb-l2 0 -best-metric auc"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, train.SwitchOn, o.cfg.KeepBest)
	assert.Equal(t, train.MetricAUC, o.cfg.BestMetric)
	assert.Negative(t, o.cfg.EmbeddingOptimizer.L2, "0 given is none, not the default")
	o, err = parseFlags(strings.Fields("-valid 0.1 -keep-best=false"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, train.SwitchOff, o.cfg.KeepBest, "-keep-best=false is off, not the default")
	o, err = parseFlags(strings.Fields("-valid 0.1 -early-stop 0"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Negative(t, o.cfg.EarlyStop, "0 given is never, not the default")
	o, err = parseFlags(strings.Fields("-valid 0.1"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Zero(t, o.cfg.EarlyStop, "not given: the default")
	_, err = parseFlags(strings.Fields("-keep-best=false -early-stop 2"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "EarlyStop 2")
	_, err = parseFlags(strings.Fields("-best-metric accuracy"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "-best-metric")
	o, err = parseFlags(nil, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Zero(t, o.cfg.EmbeddingOptimizer.L2, "not given: the default per data kind")
	_, err = parseFlags(strings.Fields("-emb-l2 x"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "-emb-l2")
	_, err = parseFlags(strings.Fields("-dense-l2 -1"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "-dense-l2")
	_, err = parseFlags(strings.Fields("-early-stop -2"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "-early-stop -2")
}

// A parameter server whose port is taken says only why it cannot serve: no banner first.
func TestServerBannerFollowsTheBind(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	addr := l.Addr().String()
	secret := filepath.Join(t.TempDir(), "secret")
	require.NoError(t, os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef"), 0o600))
	args := strings.Fields(tinyRun + " -role ps -id ps-0 -listen " + addr + " -servers ps-0=" + addr +
		" -secret-file " + secret + " -checkpoint-dir " + t.TempDir() + " -shm-dir " + t.TempDir())
	var out, errs bytes.Buffer
	require.Equal(t, 1, run(args, &out, &errs))
	assert.NotContains(t, out.String(), "Ctrl-C stops it")
	assert.Contains(t, errs.String(), "address already in use")
}

// A role with no -secret-file takes the cluster secret from the environment (a Kubernetes Secret
// arrives there), and checks it as it checks a file's.
func TestRoleTakesTheSecretFromTheEnvironment(t *testing.T) {
	args := strings.Fields(tinyRun + " -role ps -id ps-0 -listen 127.0.0.1:1 -servers ps-0=127.0.0.1:1" +
		" -checkpoint-dir " + t.TempDir() + " -shm-dir " + t.TempDir())
	var out, errs bytes.Buffer
	t.Setenv(SecretEnv, "")
	require.Equal(t, 2, run(args, &out, &errs), "no secret anywhere is a usage error")
	assert.Contains(t, errs.String(), "-secret-file or the environment variable "+SecretEnv)

	errs.Reset()
	t.Setenv(SecretEnv, "  too short \n")
	require.Equal(t, 1, run(args, &out, &errs))
	assert.Contains(t, errs.String(), "the secret in the environment variable "+SecretEnv+" is 9 bytes")

	errs.Reset()
	t.Setenv(SecretEnv, placeholderSecret)
	require.Equal(t, 1, run(args, &out, &errs))
	assert.Contains(t, errs.String(), "is the placeholder of examples/k8s/secret.yaml")
}

// The command typed twice with no -checkpoint-dir works both times: each run gets a directory
// of its own under the default, and -resume continues the newest.
func TestDefaultCheckpointDirIsEachRunsOwn(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	root := filepath.Join(os.TempDir(), "elasticps-dlrm")
	flags := "-train-records 3000 -test-records 2000 -duration 0 -dim 4 -bottom 8 -top 8 -batch 100 -checkpoint-every 10"
	var dirs []string
	for range 2 {
		var out, errs bytes.Buffer
		require.Equal(t, 0, run(strings.Fields(flags), &out, &errs), "stderr: %s", errs.String())
		runs, err := os.ReadDir(root)
		require.NoError(t, err)
		dirs = dirs[:0]
		for _, e := range runs {
			if strings.HasPrefix(e.Name(), runDirPrefix) {
				dirs = append(dirs, filepath.Join(root, e.Name()))
			}
		}
		require.NotEmpty(t, dirs)
		assert.Contains(t, out.String(), "checkpoints in "+dirs[len(dirs)-1], "the banner names the run's directory")
	}
	require.Len(t, dirs, 2, "a directory per run")

	var out, errs bytes.Buffer
	require.Equal(t, 0, run(strings.Fields(flags+" -resume -epochs 2"), &out, &errs), "stderr: %s", errs.String())
	assert.Contains(t, out.String(), "checkpoints in "+dirs[1], "-resume continues the newest run")

	_, err := runDir(filepath.Join(t.TempDir(), "none"), true, time.Now())
	assert.ErrorContains(t, err, "no earlier run")
}

// With -log-format json every line on stderr is a record that names the job, the role and the
// node; the embedded cluster's records come from the coordinator, servers and workers alike.
func TestJSONLogsNameJobRoleAndNode(t *testing.T) {
	var out, errs bytes.Buffer
	code := run(strings.Fields("-v -log-format json -train-records 3000 -test-records 1000 -duration 0 -dim 4 -bottom 8 -top 8 -batch 100 -checkpoint-every 10 -checkpoint-dir "+t.TempDir()), &out, &errs)
	require.Equal(t, 0, code, errs.String())
	lines := strings.Split(strings.TrimSpace(errs.String()), "\n")
	require.NotEmpty(t, lines)
	for _, line := range lines {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "%s", line)
		assert.Equal(t, "dlrm", rec["job"], line)
		assert.Contains(t, []any{"coordinator", "ps", "worker"}, rec["role"], line)
		assert.NotEmpty(t, rec["node"], line)
	}
	_, err := parseFlags(strings.Fields("-log-format yaml"), &bytes.Buffer{})
	assert.ErrorContains(t, err, `-log-format "yaml"`)
}

// The coordinator on Kubernetes passes its flags on to its pods as given, but those that say
// which process it is.
func TestKubeCoordinatorPassesItsFlagsOn(t *testing.T) {
	t.Setenv(SecretEnv, "0123456789abcdef0123456789abcdef")
	o, err := parseFlags(strings.Fields("-role coordinator -kube -listen 10.0.0.1:7071 -ps 3 -workers 4 -recovery partial -train-records 100 -v -status-addr 10.0.0.1:8080"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"-recovery=partial", "-train-records=100", "-v=true"}, o.passOn)
	_, err = parseFlags(strings.Fields("-role ps -kube -id ps-0 -listen h:1"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "-kube is for -role coordinator")
}

// TestFlagsKubeSizes: the pod sizes parse as Kubernetes quantities, are not passed on to the pods,
// need -kube, and the help prints.
func TestFlagsKubeSizes(t *testing.T) {
	t.Setenv(SecretEnv, "a secret of the test, long enough to be one")
	o, err := parseFlags(strings.Fields("-role coordinator -kube -listen :7070 -ps-memory 96Mi -ps-cpus 500m -worker-memory 1Gi -worker-cpus 2"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, elastic.Resources{CPUs: 0.5, Memory: 96 << 20}, o.psSize)
	assert.Equal(t, elastic.Resources{CPUs: 2, Memory: 1 << 30}, o.workerSize)
	for _, a := range o.passOn {
		assert.NotContains(t, a, "memory")
		assert.NotContains(t, a, "cpus")
	}
	_, err = parseFlags(strings.Fields("-ps-memory 96Mi"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "-kube")
	_, err = parseFlags(strings.Fields("-role coordinator -kube -listen :7070 -ps-memory -3"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "positive quantity")
	var help bytes.Buffer
	_, err = parseFlags([]string{"-h"}, &help)
	assert.ErrorIs(t, err, flag.ErrHelp)
	assert.Contains(t, help.String(), "-ps-memory")
	assert.NotContains(t, help.String(), "panic")
}

// TestFlagsAutoscale: -autoscale and its settings are the -kube coordinator's own (not passed on
// to the pods) and need -kube; bad values are refused.
func TestFlagsAutoscale(t *testing.T) {
	t.Setenv(SecretEnv, "a secret of the test, long enough to be one")
	o, err := parseFlags(strings.Fields("-role coordinator -kube -listen :7070 -autoscale -autoscale-every 2s -pending-for 30s -near-memory 1.5 -epochs 1"), &bytes.Buffer{})
	require.NoError(t, err)
	assert.True(t, o.autoscale)
	assert.Equal(t, 2*time.Second, o.autoscaleEvery)
	assert.Equal(t, 30*time.Second, o.pendingFor)
	assert.Equal(t, 1.5, o.nearMemory)
	assert.Equal(t, []string{"-epochs=1"}, o.passOn)
	_, err = parseFlags(strings.Fields("-autoscale"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "-autoscale is for -role coordinator -kube")
	_, err = parseFlags(strings.Fields("-role coordinator -kube -listen :7070 -autoscale -pending-for 0s -near-memory 0"), &bytes.Buffer{})
	assert.ErrorContains(t, err, "-pending-for 0s must be positive")
	assert.ErrorContains(t, err, "-near-memory 0 is not positive")
}

// TestDurationDefaultsPerData: the minute is the synthetic demo's; file data runs the epochs
// asked for unless -duration is given.
func TestDurationDefaultsPerData(t *testing.T) {
	for args, want := range map[string]time.Duration{
		"":                                time.Minute,
		"-data libsvm:x":                  0,
		"-data criteo:x,y -test z":        0,
		"-data movielens:ml":              0,
		"-data libfm:x -duration 30s":     30 * time.Second,
		"-data synthetic -duration 0":     0,
		"-train-records 10 -duration 90s": 90 * time.Second,
	} {
		o, err := parseFlags(strings.Fields(args), &bytes.Buffer{})
		require.NoError(t, err, args)
		assert.Equal(t, want, o.cfg.Duration, args)
	}
}

// TestFileRunWritesPredictions runs the command on a libSVM file and a test file without
// -duration: every epoch is trained, and the summary names the predictions file, which has a
// line per test record.
func TestFileRunWritesPredictions(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := range 600 {
		fmt.Fprintf(&b, "%d %d:1 %d:1\n", (i/3)%2, i%7, 100+i%11)
	}
	data, test, pred := filepath.Join(dir, "train.svm"), filepath.Join(dir, "test.svm"), filepath.Join(dir, "pred.tsv")
	require.NoError(t, os.WriteFile(data, []byte(b.String()), 0o600))
	var tb strings.Builder // held-out lines, each with a feature of its own: no training line
	for i := range 50 {
		fmt.Fprintf(&tb, "%d %d:1 %d:1 %d:1\n", (i/3)%2, i%7, 100+i%11, 200+i)
	}
	require.NoError(t, os.WriteFile(test, []byte(tb.String()), 0o600))
	var out, errs bytes.Buffer
	code := run(strings.Fields("-data libsvm:"+data+" -test "+test+" -epochs 2 -dim 4 -bottom 4 -top 4 -batch 50 -eval-every 0 -predictions "+pred+" -checkpoint-dir "+t.TempDir()), &out, &errs)
	require.Equal(t, 0, code, errs.String())
	s := out.String()
	assert.Contains(t, s, "training until the epochs are done")
	assert.Contains(t, s, "summary (every epoch done)")
	assert.Contains(t, s, "epoch 1 (complete): 600 of 600 positions covered")
	assert.Contains(t, s, "predictions: "+pred+": the test records' labels and this model's scores, 50 lines after the header")
	got, err := os.ReadFile(pred)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(got), "\n"), "\n")
	require.Equal(t, 51, len(lines), "a header and one line per test record")
	assert.Equal(t, "file:line\tlabel\tscore", lines[0])
	assert.True(t, strings.HasPrefix(lines[50], test+":50\t"), "%q", lines[50])
}
