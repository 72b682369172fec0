package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// A region is one node's shared-memory area: ShmDir/JOB/NODE holding a lock file, the extent files of
// two generations ("g0-N", "g1-N": pre-faulted, memory-mapped, never remapped) and one seal file per
// generation ("g0.seal", "g1.seal"). Extents are only ever added while the region is open, so slices
// into them stay valid until close.

// extent is one mapped file of a generation.
type extent struct {
	name string
	data []byte
	used int64 // bytes of the current chain, from the start; the append cursor
}

// generation is one of the two halves of a region.
type generation struct {
	idx     int
	extents []*extent
	segs    []*segment // the chain: segs[0] is full, the rest deltas
	sealed  int        // segs[:sealed] have their checksums computed
	chain   uint64     // bumped whenever the generation restarts with a new full snapshot
	pending int        // seal and persist jobs on this generation not yet finished
}

// data returns a range of an extent. The owner's caller holds the Checkpointer's mu (extents may be
// appended concurrently); a reader region never changes.
func (g *generation) data(ext uint32, off, n uint64) []byte {
	return g.extents[ext].data[off : off+n : off+n]
}

// largestFree returns the largest free space at the end of one extent.
func (g *generation) largestFree() int64 {
	var best int64
	for _, x := range g.extents {
		best = max(best, int64(len(x.data))-x.used)
	}
	return best
}

func (g *generation) largest() int64 {
	var best int64
	for _, x := range g.extents {
		best = max(best, int64(len(x.data)))
	}
	return best
}

// reset empties the generation for a new chain.
func (g *generation) reset() {
	for _, x := range g.extents {
		x.used = 0
	}
	g.segs = nil
	g.sealed = 0
	g.chain++
}

type region struct {
	dir       string
	job, node string
	slots     int
	writable  bool
	lock      *os.File
	gens      [2]*generation
	seq       int        // next extent file number (owner only)
	sealMu    sync.Mutex // serialises seal file writes
	closeOnce sync.Once
}

const alignment = 64

// tmpPrefix starts the name of a file being written (a seal, an extent); the owner removes such files
// left by a process that died.
const tmpPrefix = ".tmp-"

func alignUp(n int64) int64 { return (n + alignment - 1) &^ (alignment - 1) }

func sealPath(dir string, gen int) string { return filepath.Join(dir, fmt.Sprintf("g%d.seal", gen)) }

// parseExtentName parses "gG-N".
func parseExtentName(name string) (gen, n int, ok bool) {
	g, num, found := strings.Cut(name, "-")
	if !found || (g != "g0" && g != "g1") {
		return 0, 0, false
	}
	v, err := strconv.Atoi(num)
	if err != nil || v < 0 || strconv.Itoa(v) != num {
		return 0, 0, false
	}
	return int(g[1] - '0'), v, true
}

// openRegion opens dir as the owner (writable, exclusive lock, stale temporary files removed) or as a
// reader (read-only, shared lock; only sealed extents are mapped). Invalid seals are dropped (owner) or
// ignored (reader) with a log line: that generation is simply not restorable from shared memory.
func openRegion(dir, job, node string, slots int, writable bool, log *slog.Logger) (*region, error) {
	if writable {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("checkpoint: shm region: %w", err)
		}
	}
	lock, err := lockRegion(filepath.Join(dir, "lock"), writable)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: shm region %s: %w", dir, err)
	}
	r := &region{dir: dir, job: job, node: node, slots: slots, writable: writable, lock: lock}
	for i := range r.gens {
		r.gens[i] = &generation{idx: i}
	}
	if err := r.load(log); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *region) load(log *slog.Logger) error {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return fmt.Errorf("checkpoint: shm region: %w", err)
	}
	files := map[string]int64{} // extent name -> size
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, tmpPrefix) {
			if r.writable {
				os.Remove(filepath.Join(r.dir, name))
			}
			continue
		}
		if _, n, ok := parseExtentName(name); ok {
			if info, err := e.Info(); err == nil {
				files[name] = info.Size()
			}
			r.seq = max(r.seq, n+1)
		}
	}
	for g, gen := range r.gens {
		seal, err := r.readSeal(g, files)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				log.Warn("checkpoint: ignoring shared-memory seal", "dir", r.dir, "gen", g, "err", err)
				if r.writable {
					os.Remove(sealPath(r.dir, g))
				}
			}
			seal = nil
		}
		var names []string
		if seal != nil {
			for _, x := range seal.Extents {
				names = append(names, x.Name)
			}
		}
		sealed := len(names) // names[:sealed] are the seal's extents, in its order
		if r.writable {
			// The owner also maps unsealed extents of the generation: they are capacity to reuse.
			listed := map[string]bool{}
			for _, n := range names {
				listed[n] = true
			}
			var extra []string
			for name := range files {
				if eg, _, _ := parseExtentName(name); eg == g && !listed[name] {
					extra = append(extra, name)
				}
			}
			sort.Slice(extra, func(i, j int) bool {
				_, a, _ := parseExtentName(extra[i])
				_, b, _ := parseExtentName(extra[j])
				return a < b
			})
			names = append(names, extra...)
		}
		for i, name := range names {
			path := filepath.Join(r.dir, name)
			data, err := openExtent(path, r.writable)
			if err != nil && i >= sealed {
				// Not named by the seal, so only capacity: an extent whose creation was cut short
				// (empty, or of a size that cannot be mapped). Drop it rather than the region.
				log.Warn("checkpoint: removing an unusable shared-memory extent", "dir", r.dir, "extent", name, "err", err)
				os.Remove(path)
				continue
			}
			if err != nil {
				return fmt.Errorf("checkpoint: shm extent %s: %w", name, err)
			}
			gen.extents = append(gen.extents, &extent{name: name, data: data})
		}
		if seal == nil {
			continue
		}
		gen.segs = seal.Segments
		gen.sealed = len(seal.Segments)
		for _, s := range gen.segs {
			for _, t := range s.Tables {
				x := gen.extents[t.Extent]
				x.used = max(x.used, alignUp(int64(t.Off+t.Len)))
			}
			for _, b := range s.Blobs {
				x := gen.extents[b.Extent]
				x.used = max(x.used, alignUp(int64(b.Off+b.Len)))
			}
		}
	}
	return nil
}

// readSeal reads generation g's seal and checks it against the region and the extent files present.
func (r *region) readSeal(g int, files map[string]int64) (*sealFile, error) {
	b, err := os.ReadFile(sealPath(r.dir, g))
	if err != nil {
		return nil, err
	}
	s, err := decodeSeal(b)
	if err != nil {
		return nil, err
	}
	if s.Job != r.job || s.Node != r.node || int(s.Gen) != g || s.Slots != r.slots {
		return nil, fmt.Errorf("seal is for job %q node %q gen %d with %d slots", s.Job, s.Node, s.Gen, s.Slots)
	}
	if s.Piece != sealPiece {
		return nil, fmt.Errorf("seal checksum piece %d, want %d", s.Piece, sealPiece)
	}
	for _, x := range s.Extents {
		size, ok := files[x.Name]
		if eg, _, valid := parseExtentName(x.Name); !ok || !valid || eg != g || size != int64(x.Size) {
			return nil, fmt.Errorf("seal names extent %s of %d bytes, which is missing or resized", x.Name, x.Size)
		}
	}
	return s, nil
}

// newExtent creates and maps a pre-faulted extent file for generation g. The caller attaches it. The
// file is created under a temporary name and renamed once its blocks are reserved and mapped, so a
// process that dies meanwhile leaves only a temporary file, which the next owner removes.
func (r *region) newExtent(g, seq int, size int64) (*extent, error) {
	name := fmt.Sprintf("g%d-%d", g, seq)
	tmp := filepath.Join(r.dir, tmpPrefix+name)
	data, err := createExtent(tmp, size)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: shm extent of %d bytes: %w", size, err)
	}
	if err := os.Rename(tmp, filepath.Join(r.dir, name)); err != nil {
		os.Remove(tmp)
		return nil, errors.Join(fmt.Errorf("checkpoint: shm extent of %d bytes: %w", size, err), unmap(data))
	}
	return &extent{name: name, data: data}, nil
}

// writeSeal replaces generation g's seal file with s.
func (r *region) writeSeal(s *sealFile) error {
	r.sealMu.Lock()
	defer r.sealMu.Unlock()
	b := appendSeal(nil, s)
	tmp := filepath.Join(r.dir, fmt.Sprintf("%sg%d.seal", tmpPrefix, s.Gen))
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, sealPath(r.dir, int(s.Gen))); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// removeSeal unseals generation g before it is overwritten.
func (r *region) removeSeal(g int) error {
	r.sealMu.Lock()
	defer r.sealMu.Unlock()
	err := os.Remove(sealPath(r.dir, g))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// mapped returns the bytes of shared memory the region has mapped.
func (r *region) mapped() int64 {
	var n int64
	for _, g := range r.gens {
		for _, x := range g.extents {
			n += int64(len(x.data))
		}
	}
	return n
}

func (r *region) close() error {
	var err error
	r.closeOnce.Do(func() {
		for _, g := range r.gens {
			if g == nil {
				continue
			}
			for _, x := range g.extents {
				err = errors.Join(err, unmap(x.data))
				x.data = nil
			}
		}
		if r.lock != nil {
			err = errors.Join(err, r.lock.Close())
		}
	})
	return err
}

// DeleteRegion removes the shared-memory region of job/node under shmDir ("" = DefaultShmDir), for a
// node that leaves the job for good. It fails with ErrRegionLocked while a Checkpointer holds the region.
func DeleteRegion(shmDir, job, node string) error {
	if shmDir == "" {
		shmDir = DefaultShmDir
	}
	if !validIdent(job) || !validIdent(node) {
		return fmt.Errorf("checkpoint: bad job %q or node %q", job, node)
	}
	dir := filepath.Join(shmDir, job, node)
	lock, err := lockRegion(filepath.Join(dir, "lock"), true)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("checkpoint: delete region: %w", err)
	}
	os.Remove(filepath.Join(shmDir, job)) // only if empty
	return nil
}
