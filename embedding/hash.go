package embedding

import (
	"math/bits"

	"github.com/elasticps/elasticps/internal/slothash"
)

// Slot returns the slot of id among slots: xxhash64 of the id's 8 little-endian bytes, mod slots.
// Every elasticps package places rows with this function.
func Slot(id uint64, slots int) int { return slothash.Of(id, slots) }

// mix64 is the splitmix64 finaliser: a fast bijective mixer used for the table's internal
// placement (shard, index position, tag) and for initialisation. It is deliberately a different
// function from Slot, so a server owning a subset of slots still spreads its rows evenly.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

const golden = 0x9e3779b97f4a7c15

// SlotSet is a set of slots out of a fixed slot count. The zero value is not usable; make one with
// NewSlotSet. Not safe for concurrent mutation.
type SlotSet struct {
	n    int
	bits []uint64
}

// NewSlotSet returns a set over slots 0..slots-1 holding members (out-of-range members are ignored).
func NewSlotSet(slots int, members ...int) *SlotSet {
	if slots < 1 {
		slots = 1
	}
	s := &SlotSet{n: slots, bits: make([]uint64, (slots+63)/64)}
	for _, m := range members {
		s.Add(m)
	}
	return s
}

// Slots returns the slot count the set is defined over.
func (s *SlotSet) Slots() int { return s.n }

// Add puts slot into the set; out-of-range slots are ignored.
func (s *SlotSet) Add(slot int) {
	if slot >= 0 && slot < s.n {
		s.bits[slot>>6] |= 1 << (slot & 63)
	}
}

// Remove takes slot out of the set.
func (s *SlotSet) Remove(slot int) {
	if slot >= 0 && slot < s.n {
		s.bits[slot>>6] &^= 1 << (slot & 63)
	}
}

// Has reports whether slot is in the set.
func (s *SlotSet) Has(slot int) bool {
	return slot >= 0 && slot < s.n && s.bits[slot>>6]&(1<<(slot&63)) != 0
}

// Contains reports whether id's slot is in the set.
func (s *SlotSet) Contains(id uint64) bool { return s.Has(Slot(id, s.n)) }

// Len returns the number of slots in the set.
func (s *SlotSet) Len() int {
	n := 0
	for _, w := range s.bits {
		for ; w != 0; w &= w - 1 {
			n++
		}
	}
	return n
}

// Members returns the slots in the set, in increasing order.
func (s *SlotSet) Members() []int {
	out := make([]int, 0, s.Len())
	for i, w := range s.bits {
		for ; w != 0; w &= w - 1 {
			out = append(out, i*64+bits.TrailingZeros64(w))
		}
	}
	return out
}
