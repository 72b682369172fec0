package autoscale

import (
	"fmt"
	"math"
	"time"
)

// movedFraction is the share of a job's rows a change from one shape to another moves:
// servers of a new size (cores or memory) replace the old ones and take all the rows; a
// change of the server count moves the slots that change owner, |dp|/max(p, p') of them (the
// owner table is filled by rendezvous hashing); workers join and leave between steps and
// move nothing.
func movedFraction(from, to Shape) float64 {
	switch {
	case from.Server.CPU != to.Server.CPU || from.Server.Memory != to.Server.Memory:
		return 1
	case from.Servers != to.Servers:
		return math.Abs(float64(to.Servers-from.Servers)) / float64(max(from.Servers, to.Servers))
	}
	return 0
}

// rowBytesLocked is the bytes of rows the servers hold: the servers' memory last measured, or
// the profile's model size before any measurement.
func (p *Planner) rowBytesLocked() float64 {
	if p.rowBytes > 0 {
		return p.rowBytes
	}
	return float64(p.profile.ModelBytes)
}

// moveCostLocked is the seconds of training a change from one shape to another loses: the
// rows it moves at MoveBytesPerSecond, during which the job trains at MoveSpeed; and how long
// the move takes.
func (p *Planner) moveCostLocked(from, to Shape) (lost, took float64) {
	took = movedFraction(from, to) * p.rowBytesLocked() / p.cfg.MoveBytesPerSecond
	return took * (1 - p.cfg.MoveSpeed), took
}

// remainingLocked is the samples the job has left to train (the profile's samples less the
// throughput measured so far, summed over time); ok is false when the profile does not say
// how many it trains.
func (p *Planner) remainingLocked() (float64, bool) {
	total := p.profile.samples()
	if total <= 0 {
		return 0, false
	}
	// At least a twentieth of the job is left until it ends: the sum of throughputs is an
	// estimate, and a job still running has something left.
	return max(total-p.trained, total/20), true
}

// paysLocked reports whether a change from one shape to another, at throughputs x0 and x1
// (measured or predicted), pays for the rows it moves, and says why in words: the training
// time it saves over the remaining samples against Payback times the time lost while the rows
// move, or, for a change that saves no time (a cut of the servers' size), the core-seconds it
// frees over the remaining time against Payback times the job's core-seconds lost. A change
// that moves nothing, or of a job whose length is unknown, pays.
func (p *Planner) paysLocked(from, to Shape, x0, x1 float64) (bool, string) {
	c := &p.cfg
	lost, took := p.moveCostLocked(from, to)
	if lost == 0 {
		return true, ""
	}
	rem, known := p.remainingLocked()
	if !known || !(x0 > 0) {
		return true, "the job's length is unknown: not priced"
	}
	move := fmt.Sprintf("moving %.0f%% of %.1f GiB of rows takes %v at %.0f MB/s and loses %v of training",
		100*movedFraction(from, to), gib(int64(p.rowBytesLocked())), dur(took), c.MoveBytesPerSecond/1e6, dur(lost))
	left := rem / x0
	if x1 > x0*(1+1e-9) {
		saved := rem/x0 - rem/x1
		return saved >= c.Payback*lost, fmt.Sprintf("%s; it saves %v of the %v left (%.0f -> %.0f samples/s), %s %.3g x the loss",
			move, dur(saved), dur(left), x0, x1, cmpWord(saved >= c.Payback*lost), c.Payback)
	}
	freed := (from.CPU() - to.CPU()) * left
	cost := lost * from.CPU()
	return freed >= c.Payback*cost, fmt.Sprintf("%s; it frees %.0f core-seconds over the %v left against %.0f lost, %s %.3g x the loss",
		move, freed, dur(left), cost, cmpWord(freed >= c.Payback*cost), c.Payback)
}

func cmpWord(ok bool) string {
	if ok {
		return ">="
	}
	return "<"
}

func dur(s float64) time.Duration {
	if math.IsInf(s, 0) || math.IsNaN(s) || s > 1e9 {
		return time.Duration(math.MaxInt64)
	}
	return (time.Duration(s * float64(time.Second))).Round(time.Second)
}

// movesLocked is how a re-plan of a job running at shape running and throughput x0 changes
// its servers: a server added is like the others, one removed leaves its rows to the others,
// and a change must pay, from running, by the model's prediction.
func (p *Planner) movesLocked(m Model, running Shape, x0 float64) moves {
	return moves{rows: p.rowsNeed, pays: func(_, to Shape) (bool, string) {
		return p.paysLocked(running, to, x0, x0*m.Throughput(to)/m.Throughput(running))
	}}
}
