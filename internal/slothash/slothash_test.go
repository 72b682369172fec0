package slothash

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The integer hash is xxhash64 of the id's bytes, and Slot is the hash modulo the count.
func TestMatchesXXHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ids := []uint64{0, 1, 1 << 63, ^uint64(0)}
	for range 10000 {
		ids = append(ids, rng.Uint64())
	}
	for _, id := range ids {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], id)
		want := xxhash.Sum64(b[:])
		if got := Hash(id); got != want {
			t.Fatalf("Hash(%#x) = %#x, xxhash64 %#x", id, got, want)
		}
		for _, n := range []int{1, 3, 64, 1000, 4096} {
			if got := Of(id, n); got != int(want%uint64(n)) {
				t.Fatalf("Of(%#x, %d) = %d, want %d", id, n, got, want%uint64(n))
			}
		}
	}
}

func FuzzMatchesXXHash(f *testing.F) {
	f.Add(uint64(0), 4096)
	f.Add(uint64(12345), 7)
	f.Fuzz(func(t *testing.T, id uint64, n int) {
		if n <= 0 {
			return
		}
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], id)
		if got, want := Of(id, n), int(xxhash.Sum64(b[:])%uint64(n)); got != want {
			t.Fatalf("Of(%#x, %d) = %d, want %d", id, n, got, want)
		}
	})
}
