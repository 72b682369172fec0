package embedding

// EvictExpired removes every row not touched for more than Eviction.TTL steps before now and
// returns how many it removed. It does nothing when TTL is 0. It visits every row, one shard at a
// time under that shard's write lock, so call it every so many steps rather than every step.
// Step arithmetic is modulo 2^32, so a TTL must stay below 2^31 steps.
func (t *Table) EvictExpired(now uint32) int {
	ttl := t.cfg.Eviction.TTL
	if ttl == 0 {
		return 0
	}
	stride := t.stride
	removed := 0
	for si := range t.shards {
		s := &t.shards[si]
		s.mu.Lock()
		for r := uint32(0); r < s.hi; r++ {
			w := s.rowWords(r, stride)
			last := w[wordStep]
			if last == freeMark || int32(now-last) <= int32(ttl) {
				continue
			}
			id := uint64(w[0]) | uint64(w[1])<<32
			s.removeLocked(id, t.hash(id), r, t)
			removed++
		}
		s.mu.Unlock()
	}
	t.rows.Add(int64(-removed))
	t.expired.Add(uint64(removed))
	return removed
}

// evictVictimLocked removes one row of s chosen by the eviction policy among Eviction.Sample rows
// drawn at random (all rows when the shard has no more than Sample). s must hold a row.
func (t *Table) evictVictimLocked(s *shard) {
	stride := t.stride
	lru := t.cfg.Eviction.Policy == LRU
	best := int64(-1)
	var bestKey uint64
	consider := func(r uint32) {
		w := s.rowWords(r, stride)
		if w[wordStep] == freeMark {
			return
		}
		var key uint64
		if lru {
			key = uint64(w[wordStep])<<32 | uint64(w[wordFreq])
		} else {
			key = uint64(w[wordFreq])<<32 | uint64(w[wordStep])
		}
		if best < 0 || key < bestKey {
			best, bestKey = int64(r), key
		}
	}
	if n := t.cfg.Eviction.Sample; s.live <= n {
		for r := uint32(0); r < s.hi; r++ {
			consider(r)
		}
	} else {
		// Rejection-sample live rows; the free fraction is small in steady state because new rows
		// reuse free ones first.
		for tries := 0; tries < 4*n && best < 0 || tries < n; tries++ {
			s.rng = s.rng*6364136223846793005 + 1442695040888963407
			consider(uint32((s.rng >> 33) % uint64(s.hi)))
		}
	}
	if best < 0 {
		return
	}
	r := uint32(best)
	id := s.rowID(r, stride)
	s.removeLocked(id, t.hash(id), r, t)
	t.rows.Add(-1)
	t.evicted.Add(1)
}
