package ps

import (
	"github.com/elasticps/elasticps/embedding"
)

// ClearSlots forgets everything this server holds for the slots drop accepts: the rows of its
// embedding tables in those slots and the positions applied to them. Dense tensors keep their
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
	for _, a := range sets {
		a.dropSlots(drop)
	}
	return n
}

// dropSlots removes the slots drop accepts from every entry, and entries left with none.
func (a *appliedSet) dropSlots(drop func(slot int) bool) {
	for k := range a.stripes {
		st := &a.stripes[k]
		st.Lock()
		for p, slots := range st.m {
			kept := slots[:0:0]
			for _, sl := range slots {
				if !drop(int(sl)) {
					kept = append(kept, sl)
				}
			}
			if len(kept) == 0 {
				delete(st.m, p)
			} else if len(kept) < len(slots) {
				st.m[p] = kept
			}
		}
		st.Unlock()
	}
}
