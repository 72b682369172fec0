package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// runDirPrefix starts the name of each run's directory under the default -checkpoint-dir.
const runDirPrefix = "run-"

// runDir returns the checkpoint directory of an embedded run that gave no -checkpoint-dir: a
// new directory under root for a run that starts afresh, so that the command works every time
// it is typed; the newest run's for one that continues (-resume) or evaluates (-evaluate).
func runDir(root string, continues bool, now time.Time) (string, error) {
	if continues {
		entries, err := os.ReadDir(root)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		var runs []string
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), runDirPrefix) {
				runs = append(runs, e.Name())
			}
		}
		if len(runs) == 0 {
			return "", fmt.Errorf("no earlier run under %s to continue: give its -checkpoint-dir", root)
		}
		return filepath.Join(root, slices.Max(runs)), nil // the names sort by start time
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(root, runDirPrefix+now.UTC().Format("20060102-150405.000")+"-")
}
