// Package slothash places a row id in a slot: xxhash64 (seed 0) of the id's 8 little-endian
// bytes, modulo the job's slot count (embedding.Slot). It computes the hash on the integer,
// with no byte slice and no call, so that loops over ids inline it; every package that routes
// or filters rows by slot uses it.
package slothash

import "math/bits"

// The constants of xxhash64.
const (
	prime1 uint64 = 0x9e3779b185ebca87
	prime2 uint64 = 0xc2b2ae3d27d4eb4f
	prime3 uint64 = 0x165667b19e3779f9
	prime4 uint64 = 0x85ebca77c2b2ae63
	prime5 uint64 = 0x27d4eb2f165667c5
)

// Hash is xxhash64 (seed 0) of id's 8 little-endian bytes.
func Hash(id uint64) uint64 {
	h := prime5 + 8
	h ^= bits.RotateLeft64(id*prime2, 31) * prime1
	h = bits.RotateLeft64(h, 27)*prime1 + prime4
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// Slot is the slot, among slots (positive), of an id whose Hash is h. A power-of-two slot
// count (the default) takes a mask instead of a division.
func Slot(h uint64, slots int) int {
	n := uint64(slots)
	if n&(n-1) == 0 {
		return int(h & (n - 1))
	}
	return int(h % n)
}

// Of is the slot of id among slots (positive).
func Of(id uint64, slots int) int { return Slot(Hash(id), slots) }
