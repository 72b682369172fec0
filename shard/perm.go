package shard

import "math/bits"

// The dispatcher's shuffles must give the same order on every platform and Go release, since a
// restored snapshot continues an epoch's order, so they use this small self-contained generator
// instead of math/rand.

// mix64 is a bijective 64-bit finaliser (the splitmix64 output function).
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// rng is splitmix64: tiny, fast and good enough for shuffles.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// below returns a uniform value in [0, n), n > 0 (Lemire's multiply-and-reject).
func (r *rng) below(n uint64) uint64 {
	hi, lo := bits.Mul64(r.next(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(r.next(), n)
		}
	}
	return hi
}

// shuffleInt32 permutes p in place (Fisher-Yates) with a generator seeded by seed.
func shuffleInt32(p []int32, seed uint64) {
	r := rng{s: seed}
	for i := len(p) - 1; i > 0; i-- {
		j := r.below(uint64(i + 1))
		p[i], p[j] = p[j], p[i]
	}
}

// RecordOrder returns the visiting order of the n records of a shard leased with the given
// ShuffleSeed: position i of the shard is record RecordOrder(seed, n)[i] of its natural order.
// A zero seed means no shuffle: the identity order. The result is the same on every platform.
// It returns nil for n <= 0 or n > MaxShardRecords.
func RecordOrder(seed uint64, n int64) []int32 {
	if n <= 0 || n > MaxShardRecords {
		return nil
	}
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(i)
	}
	if seed != 0 {
		shuffleInt32(p, seed)
	}
	return p
}

// epochSeed derives the shard-order seed of an epoch.
func epochSeed(seed uint64, epoch int) uint64 {
	return mix64(seed ^ mix64(uint64(epoch)+0x5851f42d4c957f2d))
}

// recordSeed derives the non-zero record-shuffle seed of a shard in an epoch.
func recordSeed(seed uint64, epoch, shard int) uint64 {
	return mix64(epochSeed(seed, epoch)^mix64(uint64(shard)+0x14057b7ef767814f)) | 1
}
