package main

import (
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// display shows a run's events: a live progress bar on a terminal, log lines otherwise.
type display interface {
	event(ev train.Event)
	// close stops the display; every line is written when it returns.
	close()
}

// status is the one-line state of a run: rate, loss, AUC, checkpoints.
func status(p train.Progress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s samples  %s/s  loss %.4f", count(p.Samples), count(int64(p.SamplesPerSec)), p.Loss)
	if p.HaveEval {
		fmt.Fprintf(&b, "  AUC %.4f", p.LastEval.AUC)
	} else {
		b.WriteString("  AUC   -   ")
	}
	fmt.Fprintf(&b, "  epoch %d/%d  ckpt %d", p.Epoch+1, p.Epochs, p.Committed)
	if p.Checkpoints > 0 {
		fmt.Fprintf(&b, " (blocked %v)", p.LastBlocked.Round(10*time.Microsecond))
	}
	if m := p.Moving; m != nil {
		fmt.Fprintf(&b, "  servers %d -> %d: %d/%d slots moved", m.From, m.To, m.SlotsDone, m.SlotsTotal)
	}
	return b.String()
}

// count formats n with a k or M suffix.
func count(n int64) string {
	switch {
	case n >= 10_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// line formats an event other than progress as one or more log lines, or "".
func line(ev train.Event) string {
	p := ev.Progress
	switch ev.Kind {
	case train.EventStart, train.EventRestore, train.EventNote:
		return ev.Message
	case train.EventEval:
		return fmt.Sprintf("eval: %s AUC %.4f, log loss %.4f on %d held-out records after %s samples (%v)",
			ev.Eval.Set, ev.Eval.AUC, ev.Eval.LogLoss, ev.Eval.Samples, count(ev.Eval.Trained), ev.Eval.Duration.Round(time.Millisecond))
	case train.EventCheckpoint:
		c := ev.Checkpoint
		switch {
		case c.Skipped:
			return fmt.Sprintf("checkpoint at step %d skipped: the previous one is still being persisted", c.Step)
		case c.Err != nil:
			return fmt.Sprintf("checkpoint at step %d failed: %v", c.Step, c.Err)
		}
		kind := "delta"
		if c.Full {
			kind = "full"
		}
		return fmt.Sprintf("checkpoint at step %d (%s, %s samples): training blocked %v, %.1f MiB copied to shared memory; persisting in the background",
			c.Step, kind, count(p.Samples), c.Blocked.Round(10*time.Microsecond), float64(c.Bytes)/(1<<20))
	case train.EventCommit:
		c := ev.Checkpoint
		if c.Err != nil {
			return fmt.Sprintf("checkpoint at step %d not committed: %v", c.Step, c.Err)
		}
		return fmt.Sprintf("checkpoint at step %d committed %v after the snapshot", c.Step, c.Persist.Round(time.Millisecond))
	}
	return ""
}

// logDisplay prints one line per event and a status line every few seconds.
type logDisplay struct {
	w     io.Writer
	every time.Duration
	last  time.Time
}

func newLogDisplay(w io.Writer, every time.Duration) *logDisplay {
	return &logDisplay{w: w, every: every}
}

func (d *logDisplay) event(ev train.Event) {
	stamp := fmt.Sprintf("[%6.1fs] ", ev.Progress.Elapsed.Seconds())
	if ev.Kind == train.EventProgress {
		if time.Since(d.last) < d.every {
			return
		}
		d.last = time.Now()
		fmt.Fprintf(d.w, "%s%3.0f%%  %s\n", stamp, 100*ev.Progress.Fraction, status(ev.Progress))
		return
	}
	if s := line(ev); s != "" {
		fmt.Fprintln(d.w, stamp+strings.ReplaceAll(s, "\n", "\n"+strings.Repeat(" ", len(stamp))))
	}
}

func (d *logDisplay) close() {}

// barDisplay draws a progress bar redrawn by mpb, with the status beside it and event lines
// printed above it.
type barDisplay struct {
	p     *mpb.Progress
	bar   *mpb.Bar
	state atomic.Pointer[string]
}

// barTotal is the bar's resolution: progress is shown in thousandths.
const barTotal = 1000

func newBarDisplay(w io.Writer) *barDisplay {
	d := &barDisplay{p: mpb.New(mpb.WithOutput(w), mpb.WithWidth(32), mpb.WithRefreshRate(200*time.Millisecond))}
	empty := "starting"
	d.state.Store(&empty)
	d.bar = d.p.AddBar(barTotal,
		mpb.PrependDecorators(decor.Name("train "), decor.Percentage(decor.WCSyncSpace)),
		mpb.AppendDecorators(decor.Any(func(decor.Statistics) string { return "  " + *d.state.Load() })),
	)
	return d
}

func (d *barDisplay) event(ev train.Event) {
	s := status(ev.Progress)
	d.state.Store(&s)
	d.bar.SetCurrent(int64(ev.Progress.Fraction * barTotal))
	if l := line(ev); l != "" {
		fmt.Fprintln(d.p, l)
	}
}

func (d *barDisplay) close() {
	if d.bar.Current() < barTotal {
		d.bar.Abort(false) // stopped early: keep the bar as it stands
	}
	d.p.Wait()
}
