package wire

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPoolClasses(t *testing.T) {
	var p Pool
	assert.Nil(t, p.Get(0))
	for _, n := range []int{1, 511, 512, 513, 4096, 1<<20 + 1, MaxPooledSize - 1, MaxPooledSize} {
		b := p.Get(n)
		assert.Len(t, b, n)
		c := cap(b)
		assert.Zero(t, c&(c-1), "cap %d of Get(%d) is not a power of two", c, n)
		assert.GreaterOrEqual(t, c, n)
		assert.Less(t, c/2, max(n, 512), "cap %d of Get(%d) is more than one class too big", c, n)
		p.Put(b)
	}
	big := p.Get(MaxPooledSize + 1)
	assert.Len(t, big, MaxPooledSize+1)
	assert.Equal(t, MaxPooledSize+1, cap(big), "a buffer too large to pool is allocated at its size")
	p.Put(big) // not a class: dropped
	p.Put(make([]byte, 10, 700))
	p.Put(nil)
}

func TestPoolReuseAllocs(t *testing.T) {
	var p Pool
	p.Put(p.Get(64 << 10))
	allocs := testing.AllocsPerRun(100, func() {
		b := p.Get(64 << 10)
		p.Put(b)
	})
	// sync.Pool may drop items at a GC; steady state is allocation-free.
	assert.Less(t, allocs, 1.0)
}

// heapAfterGC returns the bytes of live heap objects after a full
// collection.
func heapAfterGC() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// Buffers larger than MaxPooledSize handed back to a pool are not kept
// alive by it: a sync.Pool keeps what it holds across one collection, so
// three such buffers would still be live after a GC.
func TestPoolKeepsNoLargeBuffers(t *testing.T) {
	var p Pool
	const n, size = 3, 8<<20 - 100 // in the 8 MiB class of a pool that kept it
	assert.Greater(t, size, MaxPooledSize)
	before := heapAfterGC()
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = p.Get(size)
		bufs[i][size-1] = 1
	}
	for _, b := range bufs {
		p.Put(b)
	}
	clear(bufs)
	grown := heapAfterGC() - before
	assert.Less(t, grown, int64(size), "%d MiB still live after the buffers were handed back", grown>>20)
	runtime.KeepAlive(&p)
}
