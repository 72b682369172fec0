package ps

import (
	"github.com/elasticps/elasticps/embedding"
)

// ClearSlots forgets everything this server holds for the slots drop accepts: the rows of its
// embedding tables in those slots and the batches applied to them (and, when drop accepts
// every slot, the shards' watermarks too). Dense tensors keep their
// rows (a restore replaces them whole). A server rolled back to a checkpoint clears its slots
// first, so rows created after the checkpoint do not survive the load. It returns the rows
// deleted. Call it while the server does not serve those slots (no owner table gives them to
// it, or training is paused).
func (s *Server) ClearSlots(drop func(slot int) bool) int {
	s.own.RLock()
	var tables []*embedding.Table
	for _, h := range s.own.tables {
		if !h.dense {
			tables = append(tables, h.t)
		}
	}
	sets := make([]*appliedSet, 0, len(s.own.applied))
	for _, a := range s.own.applied {
		sets = append(sets, a)
	}
	s.own.RUnlock()
	set := embedding.NewSlotSet(s.cfg.Slots)
	for sl := 0; sl < s.cfg.Slots; sl++ {
		if drop(sl) {
			set.Add(sl)
		}
	}
	n := 0
	if set.Len() > 0 {
		for _, t := range tables {
			n += t.DeleteSlots(set)
		}
	}
	all := set.Len() == s.cfg.Slots
	for _, a := range sets {
		if all {
			a.each(func(_ DataShard, r *AppliedShard) { *r = AppliedShard{} })
		} else {
			a.dropSlots(drop)
		}
	}
	s.own.Lock()
	s.forgetRestoredLocked(drop)
	s.own.Unlock()
	return n
}
