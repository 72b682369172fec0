package statuspage

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/elasticps/elasticps/elastic"
)

// pageView is a Snapshot as the templates show it: every figure formatted, every shape laid out.
type pageView struct {
	RefreshMS      int64
	RefreshSeconds int64 // for a browser without script
	Sampled        bool  // a sample was taken
	Updated        string

	Job, Phase, Recovery, Plan string
	Incarnation, TableVersion  uint64
	Epoch, Epochs              int
	EpochDone, EpochRecords    int64
	EpochShare                 string // "42%"
	Step, LastCommit           uint64
	Finished                   bool
	LostRecords                int64
	Violations                 int64
	Repartition                string // the newest change of the server count, "" for none
	RepartitionRunning         bool

	Servers, Workers []memberView
	Serving          int // servers not failed
	Grid             gridView
	Charts           []chartView
	Ckpt             ckptView
	Recoveries       []recoveryView // newest first
	Events           []eventView    // newest first
}

type memberView struct {
	Member
	Color                               string // a server's colour in the owner grid
	HealthText, HealthClass             string
	Unheard, CPUText, MemText, RateText string
}

type recoveryView struct {
	At, Policy, Failed, From, Took, Lost, Err string
}

type eventView struct {
	At, Kind, Text string
}

// view lays s out for the templates.
func (p *Page) view(s Snapshot) pageView {
	st := s.Status
	v := pageView{RefreshMS: p.cfg.Every.Milliseconds(), Sampled: !s.At.IsZero(), Updated: clock(s.At),
		Job: st.Job, Phase: st.Phase, Recovery: st.Recovery, Incarnation: st.Incarnation, TableVersion: st.TableVersion,
		Epoch: st.Epoch + 1, Epochs: st.Epochs, EpochDone: st.EpochDone, EpochRecords: st.EpochRecords,
		Step: st.Step, LastCommit: st.LastCommit, Finished: st.Finished, LostRecords: st.LostRecords,
		Violations: st.ExactlyOnceViolations, RefreshSeconds: max(1, int64(p.cfg.Every.Round(time.Second)/time.Second))}
	if st.Plan != (elastic.Plan{}) {
		v.Plan = st.Plan.String()
	}
	if st.EpochRecords > 0 {
		v.EpochShare = fmt.Sprintf("%.0f%%", 100*float64(st.EpochDone)/float64(st.EpochRecords))
	}
	if r := st.Repartition; r != nil {
		v.Repartition, v.RepartitionRunning = repartitionText(r), r.Running
		if r.Running && r.SlotsTotal > 0 {
			v.Repartition = fmt.Sprintf("servers %d → %d: %d of %d slots moved", r.From, r.To, r.SlotsDone, r.SlotsTotal)
		}
	}
	colors := serverColors(s.Members)
	for _, m := range s.Members {
		mv := memberView{Member: m, Unheard: durText(m.Unheard)}
		switch m.Role {
		case RoleServer:
			mv.Color = colors[m.ID]
			mv.HealthText, mv.HealthClass = m.Health, m.Health
			if m.Health == HealthFailed && m.Reason != "" {
				mv.HealthText = "failed: " + m.Reason
			}
			if m.Health == HealthSilent {
				mv.HealthText = "not answering"
			}
			if m.CPU > 0 {
				mv.CPUText = fmt.Sprintf("%.2f", m.CPU)
			}
			if m.Memory > 0 {
				mv.MemText = bytesText(m.Memory)
			}
			if m.Health != HealthFailed {
				v.Serving++
			}
			v.Servers = append(v.Servers, mv)
		case RoleWorker:
			mv.HealthText, mv.HealthClass = "between batches", "idle"
			if m.Health == HealthBatch {
				mv.HealthText, mv.HealthClass = "in a batch", "serving"
			}
			mv.RateText = num(m.StepsPerSecond) + "/s"
			v.Workers = append(v.Workers, mv)
		}
	}
	v.Grid = gridOf(st.Owners, st.Migrating, colors)
	for _, se := range s.Series {
		v.Charts = append(v.Charts, chartOf(se, s.At, p.cfg.Every))
	}
	v.Ckpt = ckptOf(s.Checkpoints)
	for i := len(s.Recoveries) - 1; i >= 0; i-- {
		v.Recoveries = append(v.Recoveries, recoveryViewOf(s.Recoveries[i]))
	}
	const events = 12
	for i := len(s.Events) - 1; i >= 0 && len(v.Events) < events; i-- {
		e := s.Events[i]
		v.Events = append(v.Events, eventView{At: clock(e.At), Kind: e.Kind, Text: e.Text})
	}
	return v
}

func recoveryViewOf(r Recovery) recoveryView {
	rv := recoveryView{At: clock(r.At), Policy: r.Policy, Failed: strings.Join(slices.Sorted(maps.Keys(r.Failed)), ", "),
		From: "step " + strconv.FormatUint(r.Step, 10), Took: durText(r.Duration), Err: r.Err}
	if r.Step == 0 {
		rv.From = "no commit"
	}
	if r.LostRecords > 0 {
		rv.Lost = strconv.FormatInt(r.LostRecords, 10)
	}
	return rv
}

// The palette of the owner grid: Okabe and Ito's eight colours, which people with any common
// colour-vision deficiency tell apart, then the same lightened.
var palette = []string{
	"#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#555555",
	"#7FB8D8", "#F2CF7F", "#7FCEB9", "#EAAE7F", "#AAD9F4", "#E5BCD3", "#F7F1A1", "#AAAAAA",
}

// serverColors gives each server a colour: by the number that ends its ID (ps-3: the fourth)
// where it has one, so that a server keeps its colour when others come and go.
func serverColors(ms []Member) map[string]string {
	out := map[string]string{}
	i := 0
	for _, m := range ms {
		if m.Role != RoleServer {
			continue
		}
		k := i
		if n, ok := trailingNumber(m.ID); ok {
			k = n
		}
		out[m.ID] = palette[k%len(palette)]
		i++
	}
	return out
}

func trailingNumber(id string) (int, bool) {
	j := len(id)
	for j > 0 && id[j-1] >= '0' && id[j-1] <= '9' {
		j--
	}
	n, err := strconv.Atoi(id[j:])
	return n, err == nil
}

// gridView is the owner table as a grid of slots, a path of cells per owner.
type gridView struct {
	Slots, Cols, Rows int
	Owners            []ownerView
	Unowned           string // path of the slots no server owns
	Migrating         int
	MigratingPath     string
}

type ownerView struct {
	ID, Color, Path  string
	Slots, Migrating int
}

// gridOf lays out owners (slot -> server) in rows of a power of two of slots, each owner's
// slots as one path of runs, and the migrating slots as a path of their own over them.
func gridOf(owners []string, migrating []int, colors map[string]string) gridView {
	g := gridView{Slots: len(owners)}
	if g.Slots == 0 {
		return g
	}
	g.Cols = 1
	for g.Cols*g.Cols < g.Slots {
		g.Cols *= 2
	}
	g.Rows = (g.Slots + g.Cols - 1) / g.Cols
	paths := map[string]*strings.Builder{}
	count := map[string]int{}
	for i := 0; i < g.Slots; {
		j := i + 1
		for j < g.Slots && j%g.Cols != 0 && owners[j] == owners[i] {
			j++
		}
		b := paths[owners[i]]
		if b == nil {
			b = &strings.Builder{}
			paths[owners[i]] = b
		}
		fmt.Fprintf(b, "M%d %dh%dv1h-%dz", i%g.Cols, i/g.Cols, j-i, j-i)
		count[owners[i]] += j - i
		i = j
	}
	moving := map[string]int{}
	var mb strings.Builder
	for _, s := range migrating {
		if s < 0 || s >= g.Slots {
			continue
		}
		fmt.Fprintf(&mb, "M%d %dh1v1h-1z", s%g.Cols, s/g.Cols)
		moving[owners[s]]++
		g.Migrating++
	}
	g.MigratingPath = mb.String()
	for _, id := range slices.Sorted(maps.Keys(paths)) {
		if id == "" {
			g.Unowned = paths[id].String()
			continue
		}
		c := colors[id]
		if c == "" {
			c = palette[len(palette)-1]
		}
		g.Owners = append(g.Owners, ownerView{ID: id, Color: c, Path: paths[id].String(), Slots: count[id], Migrating: moving[id]})
	}
	return g
}

// The geometry of a chart, in its viewBox's units.
const (
	chartW, chartH            = 320, 110
	chartLeft, chartRight     = 46, 8
	chartTop, chartBottom     = 8, 18
	chartPlotW, chartPlotH    = chartW - chartLeft - chartRight, chartH - chartTop - chartBottom
	chartX0, chartY0, chartY1 = chartLeft, chartTop, chartTop + chartPlotH
	chartLabelY               = chartH - 4
	chartRightX               = chartW - chartRight
	chartMid                  = chartTop + chartPlotH/2
)

type chartView struct {
	Name, Title, Unit string
	Last              string  // the newest value
	LastV             float64 // unformatted, for a script
	N                 int
	Points            string // the polyline
	DotX, DotY        float64
	YHi, YLo, Span    string
	Empty             string // why there is nothing to draw
	// Constants for the template.
	W, H, X0, Y0, Y1, RightX, LabelY, Mid, MidX, TickX int
}

// chartOf draws a series over the time its points span.
func chartOf(se Series, at time.Time, every time.Duration) chartView {
	c := chartView{Name: se.Name, Title: title(se.Name), Unit: se.Unit, N: len(se.Points),
		W: chartW, H: chartH, X0: chartX0, Y0: chartY0, Y1: chartY1, RightX: chartRightX, LabelY: chartLabelY, Mid: chartMid,
		MidX: chartX0 + chartPlotW/2, TickX: chartX0 - 4}
	if len(se.Points) == 0 {
		c.Empty = "no values yet"
		if se.Name != SeriesThroughput {
			c.Empty = "none observed yet"
		}
		return c
	}
	lo, hi := se.Points[0].V, se.Points[0].V
	for _, pt := range se.Points {
		lo, hi = min(lo, pt.V), max(hi, pt.V)
	}
	if se.Name == SeriesThroughput || lo >= 0 && lo < hi/2 {
		lo = 0
	}
	if hi == lo {
		pad := math.Abs(hi) * 0.1
		if pad == 0 {
			pad = 1
		}
		hi, lo = hi+pad, max(lo-pad, min(lo, 0))
	}
	top := hi
	hi += (hi - lo) * 0.05
	if lo >= 0 && top <= 1 {
		hi = min(hi, 1) // a share (AUC, accuracy) is not drawn above 1
	}
	t0, t1 := se.Points[0].At, se.Points[len(se.Points)-1].At
	span := t1.Sub(t0)
	x := func(t time.Time) float64 {
		if span <= 0 {
			return chartX0 + chartPlotW
		}
		return chartX0 + chartPlotW*t.Sub(t0).Seconds()/span.Seconds()
	}
	y := func(v float64) float64 { return chartY1 - chartPlotH*(v-lo)/(hi-lo) }
	var b strings.Builder
	for i, pt := range se.Points {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", x(pt.At), y(pt.V))
	}
	last := se.Points[len(se.Points)-1]
	c.Points, c.DotX, c.DotY = b.String(), math.Round(x(last.At)*10)/10, math.Round(y(last.V)*10)/10
	c.Last, c.LastV, c.YHi, c.YLo = num(last.V), last.V, num(hi), num(lo)
	c.Span = "last " + durText(max(span, every).Round(time.Second))
	return c
}

// title names a series for people.
func title(name string) string {
	switch name {
	case SeriesThroughput:
		return "Throughput"
	case "loss":
		return "Loss"
	case "auc":
		return "AUC"
	}
	return name
}

// ckptView is the checkpoint timeline: a bar per checkpoint of the pause, and of the time to
// its commit, with the newest few in a table.
type ckptView struct {
	N                                   int
	Pause, Lag                          []bar
	PauseMax, LagMax                    string
	First, Last                         string // steps at the ends
	Rows                                []ckptRow
	W, H, X0, Y1, LabelY, RightX, TickX int
}

type bar struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

type ckptRow struct {
	Step                               uint64
	At, Pause, Bytes, Kind, Lag, State string
	Failed                             bool
}

// The checkpoint timeline is twice as wide as a chart: it has a half-width section to itself.
const (
	ckptBars  = 48
	ckptW     = 2 * chartW
	ckptPlotW = ckptW - chartLeft - chartRight
)

func ckptOf(cs []Checkpoint) ckptView {
	v := ckptView{N: len(cs), W: ckptW, H: chartH, X0: chartX0, Y1: chartY1, LabelY: chartLabelY, RightX: ckptW - chartRight, TickX: chartX0 - 4}
	if len(cs) > ckptBars {
		cs = cs[len(cs)-ckptBars:]
	}
	if len(cs) == 0 {
		return v
	}
	var pauseMax, lagMax time.Duration
	for _, c := range cs {
		pauseMax, lagMax = max(pauseMax, c.Blocked), max(lagMax, c.CommitLag)
	}
	slot := float64(ckptPlotW) / ckptBars
	for i, c := range cs {
		x := chartX0 + float64(i)*slot
		class := ""
		if c.Err != "" {
			class = "fail"
		}
		v.Pause = append(v.Pause, barOf(x, slot, c.Blocked, pauseMax, class, fmt.Sprintf("step %d: paused %s", c.Step, durText(c.Blocked))))
		if c.Committed || c.Err != "" {
			v.Lag = append(v.Lag, barOf(x, slot, c.CommitLag, lagMax, class, fmt.Sprintf("step %d: committed %s after the snapshot", c.Step, durText(c.CommitLag))))
		}
	}
	v.PauseMax, v.LagMax = durText(pauseMax), durText(lagMax)
	v.First, v.Last = "step "+strconv.FormatUint(cs[0].Step, 10), "step "+strconv.FormatUint(cs[len(cs)-1].Step, 10)
	for i := len(cs) - 1; i >= 0 && len(v.Rows) < 6; i-- {
		c := cs[i]
		r := ckptRow{Step: c.Step, At: clock(c.At), Pause: durText(c.Blocked), Bytes: bytesText(c.Bytes), Kind: "incremental", State: "persisting"}
		if c.Full {
			r.Kind = "full"
		}
		switch {
		case c.Err != "":
			r.State, r.Failed = "failed: "+c.Err, true
		case c.Committed:
			r.State, r.Lag = "committed", durText(c.CommitLag)
		}
		v.Rows = append(v.Rows, r)
	}
	return v
}

// barOf is a bar at x, slot wide, of d against top (the chart's height), in a half-height row.
func barOf(x, slot float64, d, top time.Duration, class, title string) bar {
	h := 0.0
	if top > 0 {
		h = float64(chartPlotH/2-4) * float64(d) / float64(top)
	}
	h = max(h, 1)
	return bar{X: math.Round(x*10) / 10, Y: math.Round((chartPlotH/2-4-h)*10) / 10, W: math.Round(slot*0.7*10) / 10, H: math.Round(h*10) / 10, Class: class, Title: title}
}

// num formats v with three significant digits, and k, M, G for thousands, millions, billions.
func num(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return strconv.FormatFloat(v/1e9, 'f', 1, 64) + "G"
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case a == 0:
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// durText formats d for people: 850µs, 12ms, 1.2s, 3m20s.
func durText(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// clock formats t as the time of day; "" for the zero time.
func clock(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Format("15:04:05")
}
