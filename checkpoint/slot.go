package checkpoint

import (
	"math/bits"

	"github.com/elasticps/elasticps/internal/slothash"
)

// slotOf returns the slot of row id in a job with slots slots: the placement of embedding.Slot
// (internal/slothash). slots must be positive; slotOf returns 0 otherwise.
func slotOf(id uint64, slots int) int {
	if slots <= 0 {
		return 0
	}
	return slothash.Of(id, slots)
}

// hashID is the hash slotOf takes, for loops that place an id among two slot counts.
func hashID(id uint64) uint64 { return slothash.Hash(id) }

// hashSlot is the slot of an id whose hashID is h among slots (positive).
func hashSlot(h uint64, slots int) int { return slothash.Slot(h, slots) }

// slotSet is a set of slots in [0, n), one bit per slot.
type slotSet struct {
	n    int
	bits []uint64
}

func newSlotSet(n int) slotSet { return slotSet{n: n, bits: make([]uint64, (n+63)/64)} }

// allSlots returns the set of every slot in [0, n).
func allSlots(n int) slotSet {
	s := newSlotSet(n)
	for i := range n {
		s.add(i)
	}
	return s
}

func (s slotSet) add(i int)      { s.bits[i>>6] |= 1 << (uint(i) & 63) }
func (s slotSet) has(i int) bool { return i >= 0 && i < s.n && s.bits[i>>6]&(1<<(uint(i)&63)) != 0 }

// count returns the number of slots in the set.
func (s slotSet) count() int {
	c := 0
	for _, w := range s.bits {
		c += bits.OnesCount64(w)
	}
	return c
}

func (s slotSet) equal(o slotSet) bool {
	if s.n != o.n {
		return false
	}
	for i := range s.bits {
		if s.bits[i] != o.bits[i] {
			return false
		}
	}
	return true
}

// intersect returns the slots in both s and o (which must have the same n).
func (s slotSet) intersect(o slotSet) slotSet {
	r := newSlotSet(s.n)
	for i := range r.bits {
		r.bits[i] = s.bits[i] & o.bits[i]
	}
	return r
}

// minus returns the slots of s that are not in o (which must have the same n).
func (s slotSet) minus(o slotSet) slotSet {
	r := newSlotSet(s.n)
	for i := range r.bits {
		r.bits[i] = s.bits[i] &^ o.bits[i]
	}
	return r
}

// full reports whether s holds every slot of [0, n).
func (s slotSet) full() bool { return s.count() == s.n }

// hasID reports whether the slot of row id is in s.
func (s slotSet) hasID(id uint64) bool { return s.has(slotOf(id, s.n)) }

// subsetOf reports whether every slot of s is in o.
func (s slotSet) subsetOf(o slotSet) bool {
	for i := range s.bits {
		if s.bits[i]&^o.bits[i] != 0 {
			return false
		}
	}
	return true
}

// anyIn reports whether s holds a slot in [lo, hi).
func (s slotSet) anyIn(lo, hi int) bool {
	for i := max(lo, 0); i < hi && i < s.n; i++ {
		if s.has(i) {
			return true
		}
	}
	return false
}

// list returns the slots in ascending order.
func (s slotSet) list() []int {
	out := make([]int, 0, s.count())
	for i := range s.n {
		if s.has(i) {
			out = append(out, i)
		}
	}
	return out
}

// slotSetFrom builds the set of the given slots; out-of-range slots are reported as an error by the
// caller through ok.
func slotSetFrom(n int, slots []int) (s slotSet, ok bool) {
	s = newSlotSet(n)
	for _, x := range slots {
		if x < 0 || x >= n {
			return s, false
		}
		s.add(x)
	}
	return s, true
}
