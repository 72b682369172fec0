package train

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/elasticps/elasticps/checkpoint"
)

// minShmFree is the free space /dev/shm must have to hold the shared-memory tier by default.
const minShmFree = 1 << 30

// defaultShmDir returns the shared-memory directory for checkpoints stored in ckDir: under
// /dev/shm when it exists with room to spare, else beside the temporary files. The name depends
// on ckDir, so runs with different checkpoint directories never share a region. The choice
// depends on the free space at the time, so a run records it (placeShm) and a resume uses the
// recorded directory rather than choosing again.
func defaultShmDir(ckDir string) string {
	abs, err := filepath.Abs(ckDir)
	if err != nil {
		abs = ckDir
	}
	h := fnv.New64a()
	h.Write([]byte(abs))
	name := fmt.Sprintf("elasticps-dlrm-%016x", h.Sum64())
	if free, ok := freeBytes("/dev/shm"); ok && free >= minShmFree {
		return filepath.Join("/dev/shm", name)
	}
	return filepath.Join(os.TempDir(), name+"-shm")
}

// isDefaultShmDir reports whether dir is one defaultShmDir may choose for ckDir.
func isDefaultShmDir(dir, ckDir string) bool {
	d := defaultShmDir(ckDir)
	name := strings.TrimSuffix(filepath.Base(d), "-shm")
	return dir == filepath.Join("/dev/shm", name) || dir == filepath.Join(os.TempDir(), name+"-shm")
}

// shmRecordName is the file in the checkpoint directory that names the shared-memory directory
// of the process's regions ("shm-dir" for an embedded run, "shm-dir.ID" for a parameter server
// of a multi-process job).
const shmRecordName = "shm-dir"

func shmRecordPath(ckDir, node string) string {
	if node == "" {
		return filepath.Join(ckDir, shmRecordName)
	}
	return filepath.Join(ckDir, shmRecordName+"."+node)
}

// placeShm decides where the shared-memory regions of a run live: Config.ShmDir when set; for a
// resume, the directory recorded by the run that took the checkpoints; otherwise
// defaultShmDir. It records the choice in the checkpoint directory and returns, as prev, a
// different directory recorded before, whose regions the caller deletes (they would never be
// found again).
func placeShm(cfg *Config, node string) (dir, prev string, err error) {
	rec := shmRecordPath(cfg.CheckpointDir, node)
	if b, err := os.ReadFile(rec); err == nil {
		if p := strings.TrimSpace(string(b)); filepath.IsAbs(p) {
			prev = p
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", "", fmt.Errorf("shared-memory record: %w", err)
	}
	switch {
	case cfg.ShmDir != "":
		dir = cfg.ShmDir
	case cfg.Resume && prev != "":
		dir = prev
	default:
		dir = defaultShmDir(cfg.CheckpointDir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", "", fmt.Errorf("shared-memory directory: %w", err)
	}
	if abs != prev {
		if err := writeFileAtomic(rec, []byte(abs+"\n")); err != nil {
			return "", "", fmt.Errorf("shared-memory record: %w", err)
		}
	} else {
		prev = ""
	}
	return dir, prev, nil
}

// writeFileAtomic replaces name with data through a temporary file and a rename.
func writeFileAtomic(name string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(name), ".tmp-"+filepath.Base(name)+"-*")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), name); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// regionNodes lists the nodes that have a shared-memory region of the job under shmDir.
func regionNodes(shmDir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(shmDir, jobName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			nodes = append(nodes, e.Name())
		}
	}
	return nodes, nil
}

// deleteRegions deletes the job's shared-memory regions under shmDir, except those of the nodes
// keep accepts (nil keeps none). A region another live process holds is an error wrapping
// checkpoint.ErrRegionLocked, unless skipLocked.
func deleteRegions(shmDir string, keep func(node string) bool, skipLocked bool) error {
	nodes, err := regionNodes(shmDir)
	if err != nil {
		return fmt.Errorf("list shared-memory regions: %w", err)
	}
	var errs []error
	for _, n := range nodes {
		if keep != nil && keep(n) {
			continue
		}
		err := checkpoint.DeleteRegion(shmDir, jobName, n)
		if err == nil || errors.Is(err, fs.ErrNotExist) || skipLocked && errors.Is(err, checkpoint.ErrRegionLocked) {
			continue
		}
		errs = append(errs, fmt.Errorf("delete shared memory of %s: %w", n, err))
	}
	return errors.Join(errs...)
}
