// Command dlrm trains a DLRM (Naumov et al. 2019) on an elastic parameter-server cluster.
//
// With no flags it runs, in one process, an embedded cluster — two parameter servers, two
// workers and the data-shard dispatcher, talking over loopback TCP with a cluster secret — and
// trains for about a minute on synthetic Criteo-like data, with a live progress display, a
// flash checkpoint every 1000 steps and a summary at the end:
//
//	go run ./examples/dlrm
//	go run ./examples/dlrm -resume       # after Ctrl-C: continue from the newest checkpoint
//	go run ./examples/dlrm -data movielens:../shared/data/movielens-latest-small -duration 0
//
// The orchestration lives in package train; this command is flags, display and signals.
package main

import (
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
	"golang.org/x/term"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command: it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
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
	o.cfg.OnEvent = disp.event
	if o.verbose {
		o.cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	go func() {
		<-ctx.Done()
		// A second interrupt ends the process at once; the first lets the run checkpoint.
		stop()
	}()

	fmt.Fprintf(stdout, "dlrm: training for %v; Ctrl-C stops after a final checkpoint, -resume continues from it\n", o.cfg.Duration)
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
		return 1
	}
	return 0
}
