package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/ps"
)

// runScale is the scale sub-command: it tells the coordinator of a running multi-process job of
// parameter servers a scheduler started (-add) or is about to stop (-remove), asks it for another
// number of servers or workers, which its scaler starts and stops (-ps, -workers: a job on
// Kubernetes), or asks it to take load off hot servers (-rebalance); the coordinator moves the
// slots while the job trains, and the command returns once they moved.
func runScale(args []string, stdout, stderr io.Writer) int {
	cf := newControlFlags("scale", "-dispatcher HOST:PORT [-secret-file FILE] {-add ID=HOST:PORT,... | -remove ID,... | -ps N -workers M | -rebalance X}",
		"Moves slots onto new parameter servers, or off servers about to stop, while the job trains.", 10*time.Minute, stderr)
	fs, addr, secretFile, timeout := cf.fs, cf.addr, cf.secretFile, cf.timeout
	add := fs.String("add", "", "servers started with -role ps to give slots to, ID=HOST:PORT,...")
	remove := fs.String("remove", "", "servers to take every slot off, ID,...; stop them once this returns")
	rebalance := fs.Float64("rebalance", 0, "move the hottest slots off servers whose share of the load is above this many times the average (say 1.25), measured over -window")
	window := fs.Duration("window", 5*time.Second, "-rebalance: how long to measure the servers' load")
	servers := fs.Int("ps", 0, "the number of parameter servers the job's scaler should run (with -workers; the job must run with a scaler that starts servers, as on Kubernetes)")
	workers := fs.Int("workers", 0, "the number of workers the job's scaler should run (with -ps)")
	if code, ok := cf.parse(args); !ok {
		return code
	}
	nodes, err := parseNodes(*add)
	if err != nil {
		err = fmt.Errorf("-add: %w", err)
	}
	if (*servers > 0) != (*workers > 0) && err == nil {
		err = fmt.Errorf("-ps and -workers go together, both positive")
	}
	actions := 0
	for _, set := range []bool{*add != "", *remove != "", *rebalance != 0, *servers > 0} {
		if set {
			actions++
		}
	}
	if err != nil || *addr == "" || fs.NArg() > 0 || actions != 1 {
		if err != nil {
			fmt.Fprintf(stderr, "dlrm scale: %v\n", err)
		} else {
			fmt.Fprintln(stderr, "dlrm scale: -dispatcher and one of -add, -remove, -ps with -workers, or -rebalance are required, and nothing else")
		}
		return 2
	}
	ctl, err := dialControl(*addr, *secretFile)
	if err != nil {
		fmt.Fprintf(stderr, "dlrm scale: %v\n", err)
		return 1
	}
	defer ctl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	switch {
	case len(nodes) > 0:
		err = ctl.AddServers(ctx, nodes...)
	case *remove != "":
		err = ctl.RemoveServers(ctx, strings.Split(*remove, ",")...)
	case *servers > 0:
		err = ctl.SetPlan(ctx, elastic.Plan{Servers: *servers, Workers: *workers})
	default:
		var moves []ps.Move
		if moves, err = ctl.Rebalance(ctx, *rebalance, *window, 0); err == nil && len(moves) == 0 {
			fmt.Fprintf(stdout, "no server carries more than %g times the average load: nothing moved\n", *rebalance)
			return 0
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "dlrm scale: %v\n", err)
		return 1
	}
	st, err := ctl.Status(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "dlrm scale: done, but no status: %v\n", err)
		return 1
	}
	if r := st.Repartition; r != nil {
		fmt.Fprintf(stdout, "%d -> %d parameter servers in %v: %d of %d slots moved (%d rows), longest fence %v; owner table %d\n",
			r.From, r.To, r.Duration.Round(time.Millisecond), r.SlotsDone, r.SlotsTotal, r.MovedRows, r.MaxFenced.Round(time.Microsecond), st.TableVersion)
	}
	return 0
}

// parseNodes reads ID=HOST:PORT,... (empty: none).
func parseNodes(s string) ([]ps.Node, error) {
	if s == "" {
		return nil, nil
	}
	var out []ps.Node
	for _, part := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("%q is not ID=HOST:PORT", part)
		}
		out = append(out, ps.Node{ID: id, Addr: addr})
	}
	return out, nil
}
