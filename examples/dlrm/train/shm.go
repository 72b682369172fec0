package train

import (
	"encoding/json"
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

// shmRecord is a checkpoint directory's record of where its regions are.
type shmRecord struct {
	// Dir is the shared-memory directory (absolute).
	Dir string `json:"shm_dir"`
	// CheckpointDir is the checkpoint directory the record was written for (absolute). A copy
	// of the directory carries the original's record, which names the original's regions: a
	// run in the copy neither uses nor deletes them.
	CheckpointDir string `json:"checkpoint_dir"`
}

// readShmRecord reads the record at name; ok is false when there is none. A record of the
// first format (the directory alone, on one line) names no checkpoint directory, so no run
// takes it for its own.
func readShmRecord(name string) (rec shmRecord, ok bool, err error) {
	b, err := os.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return shmRecord{}, false, nil
	}
	if err != nil {
		return shmRecord{}, false, fmt.Errorf("shared-memory record: %w", err)
	}
	if json.Unmarshal(b, &rec) != nil {
		rec = shmRecord{Dir: strings.TrimSpace(string(b))}
	}
	if !filepath.IsAbs(rec.Dir) {
		return shmRecord{}, false, nil
	}
	return rec, true, nil
}

// shmOwnerName is the file, in the job's directory of a shared-memory directory, that names the
// checkpoint directory whose regions these are.
const shmOwnerName = ".owner"

func shmOwnerPath(shmDir string) string { return filepath.Join(shmDir, jobName, shmOwnerName) }

// shmOwner is what a shared-memory directory records of its regions.
type shmOwner struct {
	// CheckpointDir is the checkpoint directory the job's regions there belong to (absolute).
	CheckpointDir string `json:"checkpoint_dir"`
	// Created says a run of CheckpointDir made the shared-memory directory: the run that leaves
	// it empty removes it.
	Created bool `json:"created,omitempty"`
}

func readShmOwner(shmDir string) (shmOwner, bool) {
	var o shmOwner
	b, err := os.ReadFile(shmOwnerPath(shmDir))
	if err != nil || json.Unmarshal(b, &o) != nil || !filepath.IsAbs(o.CheckpointDir) {
		return shmOwner{}, false
	}
	return o, true
}

// ownedElsewhere reports the checkpoint directory other than ckDir (both absolute) that the
// regions of shmDir belong to: the one its owner file names, while that directory still
// records shmDir as its shared memory (a checkpoint directory deleted or moved away owns
// nothing any more).
func ownedElsewhere(shmDir, ckDir string) (string, bool) {
	o, ok := readShmOwner(shmDir)
	if !ok || o.CheckpointDir == ckDir {
		return "", false
	}
	records, _ := filepath.Glob(filepath.Join(o.CheckpointDir, shmRecordName+"*"))
	for _, name := range records {
		if rec, ok, _ := readShmRecord(name); ok && rec.Dir == shmDir && rec.CheckpointDir == o.CheckpointDir {
			return o.CheckpointDir, true
		}
	}
	return "", false
}

// shmPlace is where a run's regions live.
type shmPlace struct {
	dir string // the shared-memory directory
	// own says a run of this checkpoint directory made dir (or it is a default one): the run
	// that leaves it empty removes it.
	own bool
}

// placeShm decides where the shared-memory regions of a run live: Config.ShmDir when set; for a
// resume, the directory recorded by the run that took the checkpoints; otherwise
// defaultShmDir. It refuses a directory whose regions belong to another checkpoint directory
// (a copy of this one, say), records the choice in the checkpoint directory and in the
// shared-memory directory, and returns, as prev, a different directory recorded before by a
// run of this checkpoint directory, whose regions the caller deletes (they would never be
// found again). A record copied from another checkpoint directory is not this one's: its
// directory is neither used nor returned.
func placeShm(cfg *Config, node string) (place shmPlace, prev string, err error) {
	ckDir, err := filepath.Abs(cfg.CheckpointDir)
	if err != nil {
		return shmPlace{}, "", fmt.Errorf("checkpoint directory: %w", err)
	}
	recPath := shmRecordPath(cfg.CheckpointDir, node)
	rec, ok, err := readShmRecord(recPath)
	if err != nil {
		return shmPlace{}, "", err
	}
	if ok && rec.CheckpointDir == ckDir {
		if _, other := ownedElsewhere(rec.Dir, ckDir); !other {
			prev = rec.Dir
		}
	}
	dir := defaultShmDir(cfg.CheckpointDir)
	switch {
	case cfg.ShmDir != "":
		dir = cfg.ShmDir
	case cfg.Resume && prev != "":
		dir = prev
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return shmPlace{}, "", fmt.Errorf("shared-memory directory: %w", err)
	}
	if owner, other := ownedElsewhere(dir, ckDir); other {
		return shmPlace{}, "", fmt.Errorf("%w: the shared-memory directory %s holds the regions of the checkpoints in %s: give this run another one", ErrConfig, dir, owner)
	}
	o, known := readShmOwner(dir)
	created := known && o.CheckpointDir == ckDir && o.Created
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		created = true
	}
	if err := os.MkdirAll(filepath.Join(dir, jobName), 0o700); err != nil {
		return shmPlace{}, "", fmt.Errorf("shared-memory directory: %w", err)
	}
	owner, _ := json.Marshal(shmOwner{CheckpointDir: ckDir, Created: created})
	if err := writeFileAtomic(shmOwnerPath(dir), append(owner, '\n')); err != nil {
		return shmPlace{}, "", fmt.Errorf("shared-memory directory: %w", err)
	}
	if prev == dir {
		prev = ""
	}
	if want := (shmRecord{Dir: dir, CheckpointDir: ckDir}); !ok || rec != want {
		b, _ := json.Marshal(want)
		if err := writeFileAtomic(recPath, append(b, '\n')); err != nil {
			return shmPlace{}, "", fmt.Errorf("shared-memory record: %w", err)
		}
	}
	return shmPlace{dir: dir, own: created || isDefaultShmDir(dir, cfg.CheckpointDir)}, prev, nil
}

// tidyShm removes what is left of the job in shmDir once it holds no region: its owner file,
// its job directory and, when own, shmDir itself, each only if empty then.
func tidyShm(shmDir string, own bool) {
	if nodes, err := regionNodes(shmDir); err != nil || len(nodes) > 0 {
		return
	}
	os.Remove(shmOwnerPath(shmDir))
	os.Remove(filepath.Join(shmDir, jobName))
	if own {
		os.Remove(shmDir)
	}
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
