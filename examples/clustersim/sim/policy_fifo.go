package sim

// FIFO starts waiting jobs in arrival order with what their users asked for, each as soon as
// it fits: a later job starts before an earlier one only when the earlier does not fit now.
// Nothing is ever resized or preempted. It is the Kubernetes default scheduler running the
// users' configurations ("manual"), and SC20's "default".
type FIFO struct{ Label string }

// Name implements Policy.
func (f FIFO) Name() string {
	if f.Label != "" {
		return f.Label
	}
	return "FIFO"
}

// Schedule implements Policy.
func (FIFO) Schedule(s *State) {
	for _, j := range s.Waiting() {
		s.Start(j, j.Request)
	}
}
