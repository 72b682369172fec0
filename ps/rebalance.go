package ps

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
)

// PlanRebalance returns the moves that take load off the servers of t whose share of the load
// is above over times the average share (over > 1; 1.25 says 25 % above). load holds each
// slot's load (the CPU a server spent on it, or its rows served per second, between two
// ServerStats: ServerStats.Since). It moves the hottest slot of the most loaded server to the
// least loaded one, again and again, as long as the most loaded server is above the threshold;
// a slot carrying more than half the gap between the two would leave the receiver hotter than
// the giver, so a cooler one is taken, and a server whose every slot is like that is left as it
// is (moving one hot slot around helps nobody). At most maxMoves moves (0: no limit). Servers
// of t that own no slot take load too. The result is deterministic.
func PlanRebalance(t *OwnerTable, load []float64, over float64, maxMoves int) ([]Move, error) {
	if len(load) != t.Slots {
		return nil, fmt.Errorf("%w: %d slot loads for %d slots", ErrBadConfig, len(load), t.Slots)
	}
	if over <= 1 {
		return nil, fmt.Errorf("%w: threshold %v must be above 1", ErrBadConfig, over)
	}
	n := len(t.Nodes)
	owner := make([]int, t.Slots)
	per := make([]float64, n)
	var total float64
	for s := range owner {
		if load[s] < 0 {
			return nil, fmt.Errorf("%w: slot %d has load %v", ErrBadConfig, s, load[s])
		}
		owner[s] = t.OwnerIndex(s)
		per[owner[s]] += load[s]
		total += load[s]
	}
	if total == 0 || n < 2 {
		return nil, nil
	}
	avg := total / float64(n)
	var moves []Move
	for maxMoves == 0 || len(moves) < maxMoves {
		hot, cold := 0, 0
		for i := range per {
			if per[i] > per[hot] {
				hot = i
			}
			if per[i] < per[cold] {
				cold = i
			}
		}
		if per[hot] <= over*avg {
			break
		}
		half := (per[hot] - per[cold]) / 2
		best := -1
		for s, o := range owner {
			if o != hot || load[s] <= 0 || load[s] > half {
				continue
			}
			if best < 0 || load[s] > load[best] {
				best = s
			}
		}
		if best < 0 {
			break // every slot of the hot server is too hot to move usefully
		}
		owner[best] = cold
		per[hot] -= load[best]
		per[cold] += load[best]
		moves = append(moves, Move{Slot: best, From: t.Nodes[hot].ID, To: t.Nodes[cold].ID})
	}
	sort.Slice(moves, func(i, j int) bool { return moves[i].Slot < moves[j].Slot })
	return moves, nil
}

// SlotLoads turns per-server rates (ServerStats.Since of each server, any order) into a load per
// slot: the CPU share spent on it, or where no server measured any CPU, its rows served per
// second.
func SlotLoads(slots int, rates ...[]SlotRate) []float64 {
	busy := make([]float64, slots)
	rows := make([]float64, slots)
	var anyBusy bool
	for _, rs := range rates {
		for _, r := range rs {
			if r.Slot < 0 || r.Slot >= slots {
				continue
			}
			busy[r.Slot] += r.Busy
			rows[r.Slot] += r.AccessesPerSec
			anyBusy = anyBusy || r.Busy > 0
		}
	}
	if anyBusy {
		return busy
	}
	return rows
}

// ServerStats returns the report of the server at addr (see Server.Stats).
func (m *Migrator) ServerStats(ctx context.Context, addr string) (ServerStats, error) {
	var st ServerStats
	resp, err := m.rpc.Call(ctx, addr, methodStats, []byte{0})
	if err != nil {
		return st, mapErr(addr, err)
	}
	defer m.rpc.Release(resp)
	if err := json.Unmarshal(resp, &st); err != nil {
		return st, fmt.Errorf("%w: stats from %s: %w", ErrCorrupt, addr, err)
	}
	return st, nil
}
