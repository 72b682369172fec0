package embedding

import "sync"

// arena hands out the row slabs. Where the platform allows (Linux, the BSDs, macOS; not in race
// builds, whose detector watches only Go's heap) slabs are mapped outside Go's heap, so the
// garbage collector neither scans nor sweeps them and a table's size does not move the heap
// target. The table frees them when it becomes unreachable (runtime.AddCleanup), so a slab must
// never be used after its table is gone: slices into rows never leave the table's methods, except
// RowView's, which are valid only during the Range callback.
type arena struct {
	mu      sync.Mutex
	regions map[*uint32]int // off-heap slabs: first word -> length in words
}

func newArena() *arena { return &arena{regions: map[*uint32]int{}} }

// alloc returns n zeroed words, or nil when the system has no memory for them.
func (a *arena) alloc(n int) []uint32 {
	w := allocWords(n)
	if w != nil && offHeap {
		a.mu.Lock()
		a.regions[&w[0]] = n
		a.mu.Unlock()
	}
	return w
}

// free returns w, which alloc returned, to the system.
func (a *arena) free(w []uint32) {
	if len(w) == 0 || !offHeap {
		return
	}
	a.mu.Lock()
	delete(a.regions, &w[0])
	a.mu.Unlock()
	freeWords(w)
}

// release frees every slab; the arena's table is unreachable.
func (a *arena) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for p, n := range a.regions {
		freeWords(unsafeWords(p, n))
		delete(a.regions, p)
	}
}

// bytes is the memory a slab of n words takes, rounded as the allocator rounds it.
func slabBytes(n int) int64 {
	b := int64(n) * 4
	if offHeap {
		const page = 4096
		b = (b + page - 1) / page * page
	}
	return b
}
