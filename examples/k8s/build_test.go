package k8s_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// build is the dlrm binary the job's pods run, built once per test binary.
var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// dlrmBinary returns the path of the dlrm example built from this module: what the image of
// Dockerfile holds.
func dlrmBinary(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "elasticps-k8s-")
		if build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "dlrm")
		cmd := exec.Command("go", "build", "-o", build.bin, "github.com/elasticps/elasticps/examples/dlrm")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = &buildError{err: err, out: string(out)}
		}
	})
	if build.err != nil {
		t.Fatalf("build the dlrm example: %v", build.err)
	}
	return build.bin
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// cleanBuild removes the built binary.
func cleanBuild() {
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
}
