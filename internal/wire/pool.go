package wire

import (
	"math/bits"
	"sync"
)

// MaxPooledSize is the largest buffer a Pool keeps for reuse: 4 MiB.
// Larger buffers are allocated at their exact size by Get and left to the
// garbage collector by Put, so a few huge frames do not stay pinned in the
// pool (a sync.Pool holds what it was given until two garbage collections
// have passed) after their connections are gone. Allocating a buffer that
// large costs little next to moving its bytes over a network.
const MaxPooledSize = 1 << maxClassShift

const (
	minClassShift = 9  // 512 B
	maxClassShift = 22 // 4 MiB
	numClasses    = maxClassShift - minClassShift + 1
)

// Pool recycles byte buffers in power-of-two size classes from 512 B to
// MaxPooledSize (4 MiB), each class backed by a sync.Pool, so steady-state
// traffic allocates nothing. Larger requests are allocated and never kept.
// The zero value is ready to use; a Pool must not be copied after first
// use. It is safe for concurrent use.
type Pool struct {
	classes [numClasses]sync.Pool // of *[]byte with cap == class size
	holders sync.Pool             // of empty *[]byte, reused to avoid allocating on Put
}

// Get returns a buffer of length n whose contents are unspecified (not
// zeroed). The caller owns it; handing it back with Put is optional.
func (p *Pool) Get(n int) []byte {
	if n <= 0 {
		return nil
	}
	c := classOf(n)
	if c >= numClasses {
		return make([]byte, n)
	}
	if v := p.classes[c].Get(); v != nil {
		h := v.(*[]byte)
		b := (*h)[:n]
		*h = nil
		p.holders.Put(h)
		return b
	}
	return make([]byte, n, 1<<(c+minClassShift))
}

// Put hands b back for reuse. Only buffers whose capacity is exactly a size
// class are kept (anything from Get that was resliced as b[:k] qualifies);
// others are left to the garbage collector. After Put the caller must not
// touch b or any slice sharing its memory.
func (p *Pool) Put(b []byte) {
	c := cap(b)
	if c < 1<<minClassShift || c > 1<<maxClassShift || c&(c-1) != 0 {
		return
	}
	h, _ := p.holders.Get().(*[]byte)
	if h == nil {
		h = new([]byte)
	}
	*h = b[:0]
	p.classes[bits.TrailingZeros(uint(c))-minClassShift].Put(h)
}

// classOf returns the index of the smallest class holding n > 0 bytes; it is
// numClasses or more when n is larger than the largest class.
func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}
