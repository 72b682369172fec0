package statuspage

import "github.com/elasticps/elasticps/elastic"

// ownership returns the slots each server owns in st's owner table, and of them those a move
// under way is still to hand to another server.
func ownership(st elastic.Status) (slots, migrating map[string]int) {
	slots, migrating = map[string]int{}, map[string]int{}
	for _, id := range st.Owners {
		slots[id]++
	}
	for _, sl := range st.Migrating {
		if sl >= 0 && sl < len(st.Owners) {
			migrating[st.Owners[sl]]++
		}
	}
	return slots, migrating
}

// usage fills m's host, process and memory from the servers' counters in s, where the page
// read them: the process's (its memory cgroup's charge where the cgroup has a limit, else its
// resident memory), or its tables' when the process is shared with other parts of the job
// (elastic.ServerStatus.Use).
func usage(m *Member, s elastic.ServerStatus) {
	m.Host, m.Pid = s.Host, s.Pid
	m.Memory, _ = s.Use()
}

// cpu returns the cores a server used from prev to cur, dt seconds apart: its process's CPU
// time where the counters have it and the process is the server's alone, else its serving time.
func cpu(prev, cur elastic.ServerStatus, dt float64) float64 {
	used, own := cur.UsedSince(prev)
	if !own && prev.Busy == 0 {
		return 0 // no serving time in the previous sample (its counters were not read): no rate
	}
	return used.Seconds() / dt
}
