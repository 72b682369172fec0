package embedding

import "sync/atomic"

// sketch is a count-min sketch of id sightings: depth rows of width counters, updated with atomic
// adds so lookups under a shard's read lock can count. Memory is fixed at 4*width*depth bytes;
// the estimate never under-counts and over-counts by at most about e*N/width with probability
// 1-e^-depth after N sightings (Cormode & Muthukrishnan 2005).
type sketch struct {
	c     []uint32
	width uint64 // power of two
	depth int
	seed  uint64
}

func newSketch(width, depth int, seed uint64) *sketch {
	w := 1
	for w < width {
		w <<= 1
	}
	return &sketch{c: make([]uint32, w*depth), width: uint64(w), depth: depth, seed: seed}
}

// add counts one sighting of id and returns the new estimate.
func (k *sketch) add(id uint64) uint32 {
	est := ^uint32(0)
	h := mix64(id ^ k.seed)
	for r := 0; r < k.depth; r++ {
		// double hashing: row r uses h1 + r*h2
		i := (h + uint64(r)*(h>>32|1)) & (k.width - 1)
		c := &k.c[uint64(r)*k.width+i]
		v := atomic.LoadUint32(c)
		if v != ^uint32(0) {
			v = atomic.AddUint32(c, 1)
		}
		est = min(est, v)
	}
	return est
}

// estimate returns id's count without adding.
func (k *sketch) estimate(id uint64) uint32 {
	est := ^uint32(0)
	h := mix64(id ^ k.seed)
	for r := 0; r < k.depth; r++ {
		i := (h + uint64(r)*(h>>32|1)) & (k.width - 1)
		est = min(est, atomic.LoadUint32(&k.c[uint64(r)*k.width+i]))
	}
	return est
}

// admitAtLookup counts a sighting of an id that has no row and says whether to create one.
func (t *Table) admitAtLookup(id uint64) bool {
	a := &t.cfg.Admission
	switch a.Policy {
	case AdmitCount:
		return t.sketch.add(id) >= a.MinCount
	case AdmitProbability:
		u := mix64(t.hashSeed ^ (t.draws.Add(1) * golden))
		return float64(u>>11)*(1.0/(1<<53)) < a.Probability
	}
	return true
}

// admitAtApply says whether Apply may create a row for an id that has none. Apply counts no
// sightings: under AdmitCount the id must already have been seen MinCount times (its row may have
// been evicted between pull and push); under AdmitProbability only Lookup admits.
func (t *Table) admitAtApply(id uint64) bool {
	switch t.cfg.Admission.Policy {
	case AdmitCount:
		return t.sketch.estimate(id) >= t.cfg.Admission.MinCount
	case AdmitProbability:
		return false
	}
	return true
}
