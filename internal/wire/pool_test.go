package wire

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPoolClasses(t *testing.T) {
	var p Pool
	assert.Nil(t, p.Get(0))
	for _, n := range []int{1, 511, 512, 513, 4096, 1<<20 + 1, 1 << 27} {
		b := p.Get(n)
		assert.Len(t, b, n)
		c := cap(b)
		assert.Zero(t, c&(c-1), "cap %d of Get(%d) is not a power of two", c, n)
		assert.GreaterOrEqual(t, c, n)
		assert.Less(t, c/2, max(n, 512), "cap %d of Get(%d) is more than one class too big", c, n)
		p.Put(b)
	}
	big := p.Get(1<<27 + 1)
	assert.Len(t, big, 1<<27+1)
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
