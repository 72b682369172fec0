package train

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
)

// minShmFree is the free space /dev/shm must have to hold the shared-memory tier by default.
const minShmFree = 1 << 30

// defaultShmDir returns the shared-memory directory for checkpoints stored in ckDir: under
// /dev/shm when it exists with room to spare, else beside the temporary files. The name depends
// on ckDir, so runs with different checkpoint directories never share a region and a resumed
// run finds its own.
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
