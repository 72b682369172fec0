package model

import "math"

// rng is a small generator (SplitMix64). Its output is a fixed
// function of its seed on every platform and Go release, which the
// deterministic initialisation and the synthetic data rely on. The zero value
// is a valid generator (seed 0).
type rng struct {
	s     uint64
	spare float64 // second value of the last Box–Muller pair
	has   bool    // spare is unused
}

// mix64 is the SplitMix64 finaliser: a bijective, well-mixing hash of x.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// hash2 combines two words into one well-mixed word.
func hash2(a, b uint64) uint64 {
	return mix64(mix64(a+0x9e3779b97f4a7c15) ^ (b + 0x632be59bd9b4e019))
}

// newRNG returns a generator whose stream is a pure function of (a, b).
func newRNG(a, b uint64) rng { return rng{s: hash2(a, b)} }

func (r *rng) uint64() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// float64 returns a uniform value in [0, 1) with 53 random bits.
func (r *rng) float64() float64 {
	return float64(r.uint64()>>11) * (1.0 / (1 << 53))
}

// normal returns a standard normal value (Box–Muller, both values of each
// pair used).
func (r *rng) normal() float64 {
	if r.has {
		r.has = false
		return r.spare
	}
	u1 := 1 - r.float64() // (0, 1]
	u2 := r.float64()
	rad := math.Sqrt(-2 * math.Log(u1))
	sin, cos := math.Sincos(2 * math.Pi * u2)
	r.spare, r.has = rad*sin, true
	return rad * cos
}
