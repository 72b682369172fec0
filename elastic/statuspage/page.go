package statuspage

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/elastic"
)

// ErrRunning is returned by Run and Serve when the page samples already (another Run or Serve
// is under way): one loop samples a page.
var ErrRunning = errors.New("statuspage: the page samples already")

// Page is a job's status page: it samples a Source every Config.Every, keeps the newest
// samples, observed values and events, and serves them as HTML and JSON (Handler, Serve).
// Its methods are safe for concurrent use.
type Page struct {
	cfg      Config
	log      *slog.Logger
	token    string // Token(cfg.Secret); "" without a secret
	tmpl     *template.Template
	static   fs.FS
	sampling atomic.Bool // a Run or Serve samples

	// mu guards the samples and everything observed; no call to the Source is made with it
	// held (the coordinator calls ObserveCheckpoint and ObserveRecovery with its own locks).
	mu struct {
		sync.Mutex
		src     Source
		at      time.Time      // of the newest sample; zero before the first
		status  elastic.Status // at the newest sample
		members []Member
		series  map[string]*series
		order   []string // of the series, SeriesThroughput first
		refused map[string]bool
		ckpts   ring[Checkpoint]
		recs    ring[Recovery]
		events  ring[Event]
		// usageFailing is set while the Source's Usage fails, so that it is logged once.
		usageFailing bool
	}
}

// series is a chart's points and the values observed since its newest point.
type series struct {
	unit   string
	points ring[Point]
	sum    float64
	n      int
}

// New returns a page of cfg.Source. Call Run (with Handler in the program's own HTTP server)
// or Serve to sample it.
func New(cfg Config) (*Page, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Page{cfg: cfg, log: cfg.Logger}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Secret) > 0 {
		p.token = Token(cfg.Secret)
	}
	var err error
	if p.tmpl, p.static, err = parseWeb(); err != nil {
		return nil, fmt.Errorf("statuspage: %w", err)
	}
	p.mu.src = cfg.Source
	p.mu.series = map[string]*series{SeriesThroughput: {unit: "records/s", points: newRing[Point](cfg.History)}}
	p.mu.order = []string{SeriesThroughput}
	p.mu.refused = map[string]bool{}
	p.mu.ckpts = newRing[Checkpoint](cfg.Events)
	p.mu.recs = newRing[Recovery](cfg.Events)
	p.mu.events = newRing[Event](cfg.Events)
	return p, nil
}

// SetSource makes src the job the page shows, from the next sample on: for a page made before
// its coordinator, so that the coordinator's elastic.Config.OnProgress can be the page's
// ObserveProgress (or its OnCheckpoint and OnRecovery the page's ObserveCheckpoint and
// ObserveRecovery).
func (p *Page) SetSource(src Source) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.src = src
}

// Run samples the Source every Config.Every, the first time at once, until ctx ends; it
// returns ctx's error, or ErrRunning when the page samples already.
func (p *Page) Run(ctx context.Context) error {
	if !p.sampling.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer p.sampling.Store(false)
	return p.run(ctx)
}

func (p *Page) run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.Every)
	defer t.Stop()
	for {
		p.Sample(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Sample reads the Source once and records it: the throughput and the rates since the
// previous sample, a point of every series observed since, and the events between the two.
// Run calls it every Config.Every; a test calls it itself. Without a Source it does nothing.
func (p *Page) Sample(ctx context.Context) {
	p.mu.Lock()
	src := p.mu.src
	p.mu.Unlock()
	if src == nil {
		return
	}
	st := cloneStatus(p.read(ctx, src)) // the page keeps it: a Source may reuse its slices
	now := p.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noteLocked(now, st)
}

// read returns the Source's status, with the servers' counters where it has them.
func (p *Page) read(ctx context.Context, src Source) elastic.Status {
	us, ok := src.(UsageSource)
	if !ok || p.cfg.NoUsage {
		return src.Status()
	}
	uctx, cancel := context.WithTimeout(ctx, p.cfg.Every)
	defer cancel()
	st, err := us.Usage(uctx)
	p.mu.Lock()
	was := p.mu.usageFailing
	p.mu.usageFailing = err != nil
	p.mu.Unlock()
	if err != nil {
		if !was && ctx.Err() == nil {
			p.log.Warn("statuspage: the servers' counters cannot be read; the page shows the status without them", "err", err)
		}
		return src.Status()
	}
	return st
}

// Observe adds v to the named series, a chart of the page ("loss", "auc", ...): each sample
// appends the mean of the values observed since the previous one. A value that is not finite
// is dropped, as are the values of a series beyond Config.MaxSeries and of SeriesThroughput,
// which the page measures itself.
func (p *Page) Observe(name string, v float64) {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.mu.series[name]
	if s == nil || name == SeriesThroughput {
		if name == SeriesThroughput || len(p.mu.order)-1 >= p.cfg.MaxSeries {
			p.refuseLocked(name)
			return
		}
		s = &series{points: newRing[Point](p.cfg.History)}
		p.mu.series[name] = s
		p.mu.order = append(p.mu.order, name)
	}
	s.sum += v
	s.n++
}

// ObserveCheckpoint records a checkpoint's snapshot or commit: chain it into
// elastic.Config.OnCheckpoint.
func (p *Page) ObserveCheckpoint(ev elastic.CheckpointEvent) {
	now := p.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	errText := ""
	if ev.Err != nil {
		errText = ev.Err.Error()
		what := "snapshot"
		if ev.Commit {
			what = "commit"
		}
		p.eventLocked(now, EventCheckpoint, fmt.Sprintf("%s of step %d failed: %s", what, ev.Step, errText))
	}
	if !ev.Commit {
		p.mu.ckpts.push(Checkpoint{Step: ev.Step, At: now, Bytes: ev.Bytes, Full: ev.Full, Blocked: ev.Blocked, Err: errText})
		return
	}
	c := p.mu.ckpts.find(func(c *Checkpoint) bool { return c.Step == ev.Step })
	if c == nil {
		p.mu.ckpts.push(Checkpoint{Step: ev.Step, At: now})
		c = p.mu.ckpts.last()
	}
	c.Committed, c.CommitLag = ev.Err == nil, ev.Persist
	if errText != "" {
		c.Err = errText
	}
}

// ObserveProgress records the checkpoints and recoveries among a coordinator's progress events:
// it can be elastic.Config.OnProgress (or be called from the program's own), in place of
// ObserveCheckpoint and ObserveRecovery in OnCheckpoint and OnRecovery; not both, or each
// event counts twice.
func (p *Page) ObserveProgress(ev elastic.ProgressEvent) {
	ev.Observe(p.ObserveCheckpoint, p.ObserveRecovery)
}

// ObserveRecovery records a recovery from server failures: chain it into
// elastic.Config.OnRecovery. Without it the page still finds each recovery that succeeded in
// the samples (Status.LastRecovery), but not the attempts that failed.
func (p *Page) ObserveRecovery(ev elastic.RecoveryEvent) {
	now := p.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.recoveryLocked(now, ev)
}

// recoveryLocked records ev, once: a recovery the samples found already is completed with
// what the event says.
func (p *Page) recoveryLocked(now time.Time, ev elastic.RecoveryEvent) {
	r := recoveryOf(ev)
	if old := p.mu.recs.find(func(o *Recovery) bool { return o.Err == "" && r.Err == "" && o.At.Equal(r.At) && o.Step == r.Step }); old != nil {
		*old = r
		return
	}
	p.mu.recs.push(r)
	p.eventLocked(now, EventRecovery, recoveryText(r))
}

func recoveryOf(ev elastic.RecoveryEvent) Recovery {
	r := Recovery{At: ev.Detected, Policy: ev.Policy.String(), Failed: ev.Failed, Replaced: ev.Replaced, Step: ev.Step,
		TableVersion: ev.TableVersion, Replacement: ev.Replacement, Duration: ev.Duration,
		LostRecords: ev.LostRecords, TrainedRecords: ev.TrainedRecords}
	if ev.Err != nil {
		r.Err = ev.Err.Error()
	}
	return r.clone()
}

// refuseLocked logs, once per name, that a series was refused.
func (p *Page) refuseLocked(name string) {
	if !p.mu.refused[name] {
		p.mu.refused[name] = true
		p.log.Warn("statuspage: series refused: the page measures the throughput itself, and keeps at most Config.MaxSeries others",
			"series", name, "max_series", p.cfg.MaxSeries)
	}
}

func (p *Page) eventLocked(at time.Time, kind, text string) {
	p.mu.events.push(Event{At: at, Kind: kind, Text: text})
}

// Snapshot returns what the page shows now.
func (p *Page) Snapshot() Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Snapshot{At: p.mu.at, Every: p.cfg.Every, Status: p.mu.status, Members: p.mu.members,
		Checkpoints: p.mu.ckpts.values(), Recoveries: p.mu.recs.values(), Events: p.mu.events.values()}
	for _, name := range p.mu.order {
		se := p.mu.series[name]
		s.Series = append(s.Series, Series{Name: name, Unit: se.unit, Points: se.points.values()})
	}
	return s.clone()
}
