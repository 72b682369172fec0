package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/elasticps/elasticps/elastic"
)

// runStatus is the status sub-command: it asks the coordinator of a running multi-process job
// for its status and prints it.
func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dlrm status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("dispatcher", "", "the coordinator's address (its -listen)")
	secretFile := fs.String("secret-file", "", "the file holding the cluster secret")
	asJSON := fs.Bool("json", false, "print the status as JSON")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: dlrm status -dispatcher HOST:PORT -secret-file FILE [-json]\n\nPrints the status of a running job: its phase, servers, workers, data progress, checkpoints and recoveries.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *addr == "" || *secretFile == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "dlrm status: -dispatcher and -secret-file are required, and nothing else")
		return 2
	}
	st, err := fetchStatus(*addr, *secretFile, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "dlrm status: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(st)
	} else {
		err = st.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "dlrm status: %v\n", err)
		return 1
	}
	return 0
}

func fetchStatus(addr, secretFile string, timeout time.Duration) (elastic.Status, error) {
	ctl, err := dialControl(addr, secretFile)
	if err != nil {
		return elastic.Status{}, err
	}
	defer ctl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return ctl.Status(ctx)
}

// dialControl reaches the coordinator at addr with the secret in secretFile.
func dialControl(addr, secretFile string) (*elastic.RemoteControl, error) {
	secret, err := os.ReadFile(secretFile)
	if err != nil {
		return nil, err
	}
	return elastic.NewRemoteControl(elastic.RemoteConfig{Addr: addr, Secret: bytes.TrimSpace(secret)})
}
