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
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/statuspage"
)

// runStatus is the status sub-command: it asks the coordinator of a running multi-process job
// for its status and prints it.
func runStatus(args []string, stdout, stderr io.Writer) int {
	cf := newControlFlags("status", "{-dispatcher HOST:PORT | -page URL} [-secret-file FILE] [-json]",
		"Prints the status of a running job: its phase, servers, workers, data progress, checkpoints and recoveries.\n"+
			"It asks the coordinator over its control port (-dispatcher, with -secret-file), or reads its status page's JSON (-page; -secret-file unless the page is on loopback).", 10*time.Second, stderr)
	fs, addr, secretFile, timeout := cf.fs, cf.addr, cf.secretFile, cf.timeout
	asJSON := fs.Bool("json", false, "print the status as JSON")
	page := fs.String("page", "", "the coordinator's status page (the URL the coordinator prints), read instead of the control port")
	if code, ok := cf.parse(args); !ok {
		return code
	}
	if (*addr == "") == (*page == "") || (*addr != "" && *secretFile == "" && os.Getenv(SecretEnv) == "") || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "dlrm status: one of -dispatcher (with -secret-file or "+SecretEnv+") or -page is required, and nothing else")
		return 2
	}
	var st elastic.Status
	var err error
	if *page != "" {
		st, err = fetchPage(*page, *secretFile, *timeout)
	} else {
		st, err = fetchStatus(*addr, *secretFile, *timeout)
	}
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

// controlFlags are the flags of a sub-command that talks to a running job's coordinator.
type controlFlags struct {
	fs         *flag.FlagSet
	addr       *string
	secretFile *string
	timeout    *time.Duration
}

// newControlFlags makes the flag set of sub-command name (its synopsis and one-line
// description for -h), with -dispatcher, -secret-file and -timeout; the caller adds its own.
func newControlFlags(name, synopsis, about string, timeout time.Duration, stderr io.Writer) controlFlags {
	fs := flag.NewFlagSet("dlrm "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cf := controlFlags{
		fs:         fs,
		addr:       fs.String("dispatcher", "", "the coordinator's address (its -listen)"),
		secretFile: fs.String("secret-file", "", "the file holding the cluster secret (default: the environment variable "+SecretEnv+")"),
		timeout:    fs.Duration("timeout", timeout, "give up after this long"),
	}
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: dlrm %s %s\n\n%s\n\n", name, synopsis, about)
		fs.PrintDefaults()
	}
	return cf
}

// parse parses args; when it reports false the command exits with the status it returns (0
// after -h).
func (cf controlFlags) parse(args []string) (int, bool) {
	if err := cf.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	return 0, true
}

// fetchPage reads the status from the coordinator's status page at url, with the secret in
// secretFile (none: a page on loopback).
func fetchPage(url, secretFile string, timeout time.Duration) (elastic.Status, error) {
	secret := bytes.TrimSpace([]byte(os.Getenv(SecretEnv)))
	if secretFile != "" {
		b, err := os.ReadFile(secretFile)
		if err != nil {
			return elastic.Status{}, err
		}
		secret = bytes.TrimSpace(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	snap, err := statuspage.Fetch(ctx, url, secret)
	return snap.Status, err
}

// dialControl reaches the coordinator at addr with the secret in secretFile.
func dialControl(addr, secretFile string) (*remote.Control, error) {
	secret, from, err := readSecret(secretFile)
	if err != nil {
		return nil, err
	}
	if len(secret) == 0 {
		return nil, fmt.Errorf("no cluster secret in %s", from)
	}
	return remote.NewControl(remote.Config{Addr: addr, Secret: secret})
}
