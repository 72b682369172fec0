package kubetest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// EnvTools names the environment variable that, when set, is the directory holding the
// control plane's binaries, in place of the default cache directory. Give an absolute path: a
// test runs in its package's directory.
const EnvTools = "ELASTICPS_KUBE_TOOLS"

// BuildScript is the script, relative to the module's root, that builds the binaries.
const BuildScript = "internal/kubetest/build-tools.sh"

// toolsModule is the directory of the tools module, relative to the module's root.
const toolsModule = "internal/kubetest/tools"

// Binary names, as build-tools.sh writes them.
const (
	binEtcd       = "etcd"
	binAPIServer  = "kube-apiserver"
	binScheduler  = "kube-scheduler"
	binController = "kube-controller-manager"
)

// ErrNoTools is returned when the control plane's binaries are not where ToolsDir says: they
// have not been built on this machine, or not for the tools module's current versions.
var ErrNoTools = errors.New("kubetest: control plane binaries not built")

// ToolsDir returns the directory that holds (or will hold) the control plane's binaries: the
// value of EnvTools when set, else ${XDG_CACHE_HOME:-$HOME/.cache}/elasticps/kube/KEY, where KEY
// is the first 16 hex digits of the SHA-256 of the tools module's go.sum, so that a change of
// versions builds anew. It finds the tools module by walking up from the
// working directory, which for a test is its package's directory inside the module.
func ToolsDir() (string, error) {
	if dir := os.Getenv(EnvTools); dir != "" {
		return dir, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	sum, err := os.ReadFile(filepath.Join(root, toolsModule, "go.sum"))
	if err != nil {
		return "", fmt.Errorf("kubetest: %w", err)
	}
	h := sha256.Sum256(sum)
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("kubetest: no cache directory: %w", err)
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "elasticps", "kube", hex.EncodeToString(h[:8])), nil
}

// moduleRoot returns the nearest directory, from the working directory up, that holds the
// tools module.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("kubetest: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, toolsModule, "go.sum")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("kubetest: no %s above the working directory; set %s", toolsModule, EnvTools)
		}
		dir = parent
	}
}

// tools are the paths of the binaries.
type tools struct {
	etcd, apiserver, scheduler, controller string
}

// findTools returns the binaries' paths, or an error wrapping ErrNoTools that says how to build
// them.
func findTools() (tools, error) {
	dir, err := ToolsDir()
	if err != nil {
		return tools{}, err
	}
	tl := tools{
		etcd:       filepath.Join(dir, binEtcd),
		apiserver:  filepath.Join(dir, binAPIServer),
		scheduler:  filepath.Join(dir, binScheduler),
		controller: filepath.Join(dir, binController),
	}
	for _, p := range []string{tl.etcd, tl.apiserver, tl.scheduler, tl.controller} {
		if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
			return tools{}, fmt.Errorf("%w: no %s; build them with `bash %s` (about 25 CPU-minutes, once)", ErrNoTools, p, BuildScript)
		}
	}
	return tl, nil
}
