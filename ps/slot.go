package ps

import "math/bits"

// The constants of xxhash64.
const (
	xxPrime1 uint64 = 0x9e3779b185ebca87
	xxPrime2 uint64 = 0xc2b2ae3d27d4eb4f
	xxPrime3 uint64 = 0x165667b19e3779f9
	xxPrime4 uint64 = 0x85ebca77c2b2ae63
	xxPrime5 uint64 = 0x27d4eb2f165667c5
)

// idHash is xxhash64 (seed 0) of id's 8 little-endian bytes, the hash embedding.Slot takes,
// computed on the integer: no byte slice and no call, so a loop over a batch's ids inlines it.
func idHash(id uint64) uint64 {
	h := xxPrime5 + 8
	h ^= bits.RotateLeft64(id*xxPrime2, 31) * xxPrime1
	h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return h
}

// hashSlot is the slot of an id whose idHash is h, among slots: embedding.Slot(id, slots). A
// power-of-two slot count (the default) takes a mask instead of a division.
func hashSlot(h uint64, slots int) int {
	n := uint64(slots)
	if n&(n-1) == 0 {
		return int(h & (n - 1))
	}
	return int(h % n)
}

// slotOf is embedding.Slot(id, slots), inlined.
func slotOf(id uint64, slots int) int { return hashSlot(idHash(id), slots) }
