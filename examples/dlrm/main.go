// Command dlrm trains a DLRM (Naumov et al. 2019) on an elastic parameter-server cluster.
//
// With no flags it runs, in one process, an embedded cluster — two parameter servers, two
// workers and the data-shard dispatcher, talking over loopback TCP with a cluster secret — and
// trains for about a minute on synthetic Criteo-like data, with a live progress display, a
// flash checkpoint every 1000 steps or 10 seconds, whichever comes first, and a summary at the end:
//
//	go run ./examples/dlrm
//	go run ./examples/dlrm -resume       # after Ctrl-C: continue from the newest checkpoint
//	go run ./examples/dlrm -overwrite    # start afresh, deleting the checkpoints of the run before
//	go run ./examples/dlrm -data movielens:../shared/data/movielens-latest-small   # every epoch (file data has no -duration by default)
//	go run ./examples/dlrm -data movielens:ml-100k/u1.base -test ml-100k/u1.test
//	go run ./examples/dlrm status -dispatcher HOST:PORT -secret-file FILE   # a running multi-process job
//	go run ./examples/dlrm scale -dispatcher HOST:PORT -secret-file FILE -add ps-2=HOST:PORT   # give it a server
//
// Checkpoints go to -checkpoint-dir, by default one directory in the temporary directory that
// every run without the flag shares. A run that would start afresh over the commits of an earlier
// run refuses (exit status 1) and says how to go on: -resume continues that run, -overwrite
// deletes its checkpoints, another -checkpoint-dir keeps both. Only the coordinator (the embedded
// run, or -role coordinator) ever deletes commits, and one that finds its servers running takes the
// job over instead. Warnings about the checkpoints (a damaged commit skipped at a resume and moved
// aside, a damaged storage copy of a commit restored from shared memory) go to stderr, -v or not.
// A run that ends with trained steps no commit holds (its final checkpoint failed) exits with
// status 1 and says which step a resume would restore.
//
// A -test file whose records are also in the training data (identical after parsing; -data X
// -test X, or the MovieLens 100K u.data with its u1.test) is refused before training, with the
// count and the first few file:line pairs; -allow-overlap trains anyway and the summary gives
// the count.
//
// Exit status: 0 when the run trained (or evaluated) and its final checkpoint is committed; 1
// for any failure, a refused overlap and a failed exactly-once check included; 75 (ExitHandedOver) for a coordinator
// on Kubernetes (-kube) that was interrupted and left the job running for the next one, which
// examples/k8s/job.yaml's podFailurePolicy does not count as a failure of the Job. With -recovery partial a run that lost
// updates in a recovery still exits 0, since that is the policy it was given: the loss is
// printed in the summary (its exactly-once line and a recoveries line) and logged to stderr at
// each recovery, with how many positions' updates were lost.
//
// The orchestration lives in package train; this command is flags, display and signals.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/elasticps/elasticps/ps"
	"golang.org/x/term"
)

// ExitHandedOver is the exit status of a coordinator that handed its running job over
// (train.ErrHandedOver): no failure, yet the job is not done (75 is EX_TEMPFAIL of sysexits.h).
const ExitHandedOver = 75

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command: it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "status" {
		return runStatus(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "scale" {
		return runScale(args[1:], stdout, stderr)
	}
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "dlrm: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var disp display
	if f, ok := stdout.(*os.File); ok && !o.plain && term.IsTerminal(int(f.Fd())) {
		disp = newBarDisplay(stdout)
	} else {
		disp = newLogDisplay(stdout, 5*time.Second)
	}
	o.cfg.OnEvent = func(ev train.Event) {
		if ev.Kind == train.EventWarning {
			fmt.Fprintf(stderr, "dlrm: warning: %s\n", ev.Message)
			return
		}
		disp.event(ev)
	}
	if o.verbose {
		o.cfg.Logger = newLogger(stderr, slog.LevelInfo, o.logJSON)
	}
	go func() {
		<-ctx.Done()
		// A second interrupt ends the process at once; the first lets the run checkpoint.
		stop()
	}()

	if o.role != "" {
		err := runRole(ctx, o, stdout, stderr)
		disp.close()
		if errors.Is(err, train.ErrHandedOver) {
			fmt.Fprintf(stderr, "dlrm: %v\n", err)
			return ExitHandedOver
		}
		if err != nil {
			fmt.Fprintf(stderr, "dlrm: %v\n", err)
			explain(stderr, o, err)
			return 1
		}
		return 0
	}
	if o.defaultDir {
		dir, err := runDir(o.cfg.CheckpointDir, o.cfg.Resume || o.cfg.Evaluate != "", time.Now())
		if err != nil {
			disp.close()
			fmt.Fprintf(stderr, "dlrm: %v\n", err)
			return 1
		}
		o.cfg.CheckpointDir = dir
	}
	fmt.Fprintln(stdout, banner(&o.cfg))
	sum, err := train.Run(ctx, o.cfg)
	disp.close()
	if sum != nil {
		fmt.Fprint(stdout, "\n"+sum.String())
		if sum.StopReason == "interrupted" {
			fmt.Fprintf(stdout, "\nresume with: go run ./examples/dlrm -resume -checkpoint-dir %s (and the same data and model flags)\n", sum.Checkpoints.Dir)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "dlrm: %v\n", err)
		explain(stderr, o, err)
		return 1
	}
	return 0
}

// banner says what an embedded run is about to do.
func banner(c *train.Config) string {
	switch {
	case c.Evaluate == "best" || c.Evaluate == "newest":
		return fmt.Sprintf("dlrm: evaluating the %s commit of %s; nothing is trained", c.Evaluate, c.CheckpointDir)
	case c.Evaluate != "":
		return fmt.Sprintf("dlrm: evaluating the commit of step %s of %s; nothing is trained", c.Evaluate, c.CheckpointDir)
	case c.Duration == 0:
		return fmt.Sprintf("dlrm: training until the epochs are done, checkpoints in %s; Ctrl-C stops after a final checkpoint, -resume continues from it", c.CheckpointDir)
	}
	return fmt.Sprintf("dlrm: training for %v, checkpoints in %s; Ctrl-C stops after a final checkpoint, -resume continues from it", c.Duration, c.CheckpointDir)
}

// explain adds what to do about err, for the errors a person can act on.
func explain(w io.Writer, o *options, err error) {
	if errors.Is(err, train.ErrCheckpointsExist) {
		fmt.Fprintf(w, "dlrm: continue that run with -resume, delete its checkpoints with -overwrite, or use another -checkpoint-dir\n")
	}
}

// runRole runs one role of a multi-process job until it is done or interrupted.
func runRole(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	secret, from, err := readSecret(o.secretFile)
	if err != nil {
		return err
	}
	if len(secret) < ps.MinSecretSize {
		return fmt.Errorf("the secret in %s is %d bytes; use at least %d random bytes (head -c 32 /dev/urandom | base64)", from, len(secret), ps.MinSecretSize)
	}
	if string(secret) == placeholderSecret {
		return fmt.Errorf("the secret in %s is the placeholder of examples/k8s/secret.yaml, which anyone can read: make your own (kubectl create secret generic elasticps --from-literal=secret=\"$(head -c 32 /dev/urandom | base64)\")", from)
	}
	var nodes []ps.Node
	if !o.kube { // on Kubernetes the coordinator starts the servers and knows their names
		if nodes, err = train.ParseNodes(o.psList); err != nil {
			return fmt.Errorf("-servers: %w", err)
		}
	}
	if o.cfg.Logger == nil {
		o.cfg.Logger = newLogger(stderr, slog.LevelWarn, o.logJSON)
	}
	rc := train.RoleConfig{Config: o.cfg, ID: o.id, Listen: o.listen, PS: nodes, Dispatcher: o.dispatcher, Workers: o.workers, Secret: secret, Gossip: o.gossip}
	if o.seeds != "" {
		if rc.Seeds, err = train.SplitList(o.seeds); err != nil {
			return fmt.Errorf("-seeds: %w", err)
		}
	}
	switch o.role {
	case "ps":
		// Said once the port is bound: a server that cannot listen says only why.
		onEvent := rc.OnEvent
		rc.OnEvent = func(ev train.Event) {
			if ev.Kind == train.EventStart {
				fmt.Fprintf(stdout, "dlrm: %s; Ctrl-C stops it\n", ev.Message)
			} else if onEvent != nil {
				onEvent(ev)
			}
		}
		return train.RunServer(ctx, rc)
	case "worker":
		fmt.Fprintf(stdout, "dlrm: worker %s, dispatcher %s\n", o.id, o.dispatcher)
		n, err := train.RunWorker(ctx, rc)
		fmt.Fprintf(stdout, "dlrm: worker %s trained %d samples\n", o.id, n)
		return err
	default:
		coordinate := func(ctx context.Context, rc train.RoleConfig) error {
			return coordinator(ctx, rc, stdout)
		}
		if o.kube {
			fmt.Fprintf(stdout, "dlrm: coordinator on Kubernetes, dispatcher on %s, %d servers and %d workers as pods; an interrupt leaves the job to the next coordinator\n", o.listen, o.cfg.Servers, o.workers)
			return runKubeCoordinator(ctx, o, rc, coordinate)
		}
		fmt.Fprintf(stdout, "dlrm: coordinator and dispatcher on %s for %d workers; Ctrl-C stops the job after a final checkpoint\n", o.listen, o.workers)
		return coordinate(ctx, rc)
	}
}

// coordinator runs the coordinator of a multi-process job and prints its summary.
func coordinator(ctx context.Context, rc train.RoleConfig, stdout io.Writer) error {
	sum, err := train.RunCoordinator(ctx, rc)
	if sum != nil {
		verdict := sum.Verdict()
		fmt.Fprintf(stdout, "\njob: %s; %d samples counted by the dispatcher (%d in this run, %.0f/s), %s; %d checkpoints committed, training blocked %v on average, newest step %d in %s\n",
			sum.StopReason, sum.TotalSamples, sum.Samples, sum.SamplesPerSec, verdict, sum.Checkpoints.Committed, sum.Checkpoints.MeanBlocked().Round(time.Microsecond), sum.Checkpoints.LastCommitted, sum.Checkpoints.Dir)
		for _, e := range sum.Epochs {
			fmt.Fprintf(stdout, "  %s\n", e)
		}
	}
	return err
}

// SecretEnv names the environment variable that holds the cluster secret of a process with
// -role and no -secret-file: how a Kubernetes pod gets it from a Secret (env valueFrom
// secretKeyRef) without its ever being on a command line.
const SecretEnv = "ELASTICPS_SECRET"

// placeholderSecret is the value examples/k8s/secret.yaml holds so that the manifests name their
// Secret; a job refuses to run with it.
const placeholderSecret = "replace-me-with-32-random-bytes-in-base64"

// readSecret returns the cluster secret from file, or from the environment variable SecretEnv
// when file is empty, with surrounding space trimmed, and says where it came from.
func readSecret(file string) (secret []byte, from string, err error) {
	if file == "" {
		return bytes.TrimSpace([]byte(os.Getenv(SecretEnv))), "the environment variable " + SecretEnv, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, "", err
	}
	return bytes.TrimSpace(b), file, nil
}

// newLogger logs records from level on to w, as text or as JSON lines.
func newLogger(w io.Writer, level slog.Level, asJSON bool) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if asJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
