package autoscale

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// JobProfile is what is known of a job before it runs.
type JobProfile struct {
	// Kind names the model family ("dlrm", "wide-deep"); records of the same kind are
	// preferred when planning from the history.
	Kind string `json:"kind,omitempty"`
	// ModelBytes is the size of the model's parameters (embedding rows and dense tensors).
	ModelBytes int64 `json:"model_bytes"`
	// DatasetSamples is the number of training samples per epoch (0: unknown).
	DatasetSamples int64 `json:"dataset_samples,omitempty"`
	// Epochs is how many times the job trains on the dataset; 0 counts as 1. With
	// DatasetSamples it gives the job's length, against which changes that move rows are
	// priced (Config.Payback).
	Epochs int `json:"epochs,omitempty"`
	// BatchSize is the samples per step of a worker.
	BatchSize int `json:"batch_size"`
	// Request is what the job's user asked for (zero: nothing). A first plan from the
	// history gives each process what the earlier jobs' processes used of their users'
	// requests, times this one's (Config.CoreQuantile, MemoryQuantile).
	Request Shape `json:"request,omitzero"`
}

func (p JobProfile) validate() error {
	if p.ModelBytes <= 0 || p.BatchSize <= 0 || p.DatasetSamples < 0 || p.Epochs < 0 ||
		p.Request.Workers < 0 || p.Request.Servers < 0 || p.Request.Worker.CPU < 0 || p.Request.Server.CPU < 0 ||
		p.Request.Worker.Memory < 0 || p.Request.Server.Memory < 0 {
		return fmt.Errorf("%w: %+v", ErrInvalidProfile, p)
	}
	return nil
}

// samples is the samples the job trains in all; 0: unknown.
func (p JobProfile) samples() float64 {
	return float64(p.DatasetSamples) * float64(max(p.Epochs, 1))
}

// requested reports whether the profile gives a usable request.
func (p JobProfile) requested() bool {
	r := p.Request
	return r.Workers > 0 && r.Servers > 0 && r.Worker.CPU > 0 && r.Server.CPU > 0
}

// distance is the Euclidean distance of the logarithms of the sizes; an unknown dataset size
// on either side does not count.
func (p JobProfile) distance(q JobProfile) float64 {
	sq := func(a, b float64) float64 {
		if a <= 0 || b <= 0 {
			return 0
		}
		d := math.Log(a) - math.Log(b)
		return d * d
	}
	return math.Sqrt(sq(float64(p.ModelBytes), float64(q.ModelBytes)) +
		sq(float64(p.DatasetSamples), float64(q.DatasetSamples)) +
		sq(float64(p.BatchSize), float64(q.BatchSize)))
}

// JobRecord is what a finished job leaves for planning the next ones (Planner.Record).
type JobRecord struct {
	Job     string     `json:"job"`
	Profile JobProfile `json:"profile"`
	// Shape is the shape it ran at the end.
	Shape Shape `json:"shape"`
	// Model is its fitted resource-performance model; nil if none was fitted.
	Model *Model `json:"model,omitempty"`
	// Throughput is its mean measured samples per second at Shape.
	Throughput float64 `json:"throughput,omitempty"`
	// PeakServerMemory is the most memory one of its servers used, in bytes (0: unknown).
	PeakServerMemory int64 `json:"peak_server_memory,omitempty"`
	// PeakWorkerMemory is the most memory one of its workers used, in bytes (0: unknown).
	PeakWorkerMemory int64 `json:"peak_worker_memory,omitempty"`
	// PeakRowMemory is the most memory its servers used in all at one time, in bytes (0:
	// unknown): what its rows took, whatever the server count was then.
	PeakRowMemory int64 `json:"peak_row_memory,omitempty"`
	// WorkerCores and ServerCores are the most cores a worker and a server were measured to
	// use while they worked (0: unknown); WorkerCoresAtLeast and ServerCoresAtLeast say the
	// process used all the cores it had, so that it might have used more.
	WorkerCores        float64   `json:"worker_cores,omitempty"`
	ServerCores        float64   `json:"server_cores,omitempty"`
	WorkerCoresAtLeast bool      `json:"worker_cores_at_least,omitempty"`
	ServerCoresAtLeast bool      `json:"server_cores_at_least,omitempty"`
	Finished           time.Time `json:"finished,omitzero"`
}

// memoryPerModelByte is the server memory the job took per byte of its model: its peak
// row memory, or its peak server memory times its servers (an over-estimate when the count
// changed), over its model bytes.
func (r JobRecord) memoryPerModelByte() (float64, bool) {
	if r.Profile.ModelBytes <= 0 {
		return 0, false
	}
	if r.PeakRowMemory > 0 {
		return float64(r.PeakRowMemory) / float64(r.Profile.ModelBytes), true
	}
	if r.PeakServerMemory <= 0 || r.Shape.Servers <= 0 {
		return 0, false
	}
	return float64(r.PeakServerMemory) * float64(r.Shape.Servers) / float64(r.Profile.ModelBytes), true
}

// perBytes returns the memory per model byte of the records of kind (of every record when
// none is of that kind), ascending.
func perBytes(kind string, recs []JobRecord) []float64 {
	for pass := range 2 {
		var vs []float64
		for _, r := range recs {
			if v, ok := r.memoryPerModelByte(); ok && (pass == 1 || r.Profile.Kind == kind) {
				vs = append(vs, v)
			}
		}
		if len(vs) > 0 {
			slices.Sort(vs)
			return vs
		}
	}
	return nil
}

// memoryPerByte chooses the server memory per model byte of a first plan from the values the
// earlier jobs measured (ascending): the one of least expected memory-time, counting the
// memory held over the job's expected run of T seconds and, with the chance that the rows
// need more (the share of values above it, by the n+1 rule of quantile), the memory held
// idle while the job restores its rows after running out, R seconds; at least the values'
// q-quantile. Without T and R it is that quantile. It returns the value and the chance it
// is exceeded.
func memoryPerByte(vs []float64, q, T, R float64) (float64, float64) {
	n := len(vs)
	if n == 0 {
		return 0, 1
	}
	over := func(k int) float64 { return float64(n-1-k+1) / float64(n+1) } // above the k-th of n
	k0 := min(n-1, max(0, int(math.Ceil(q*float64(n+1)))-1))
	best, cost := k0, math.Inf(1)
	for k := k0; k < n; k++ {
		if !(T > 0) || !(R > 0) {
			break
		}
		if c := vs[k] * (T + over(k)*R); c < cost {
			best, cost = k, c
		}
	}
	return vs[best], over(best)
}

// platformMemoryPerModelByte is the median memory per model byte of the records of kind (of
// every record when none is of that kind), and how many records it is the median of.
func platformMemoryPerModelByte(kind string, recs []JobRecord) (float64, int) {
	for pass := range 2 {
		var vs []float64
		for _, r := range recs {
			if v, ok := r.memoryPerModelByte(); ok && (pass == 1 || r.Profile.Kind == kind) {
				vs = append(vs, v)
			}
		}
		if len(vs) == 0 {
			continue
		}
		slices.Sort(vs)
		n := len(vs)
		if n%2 == 1 {
			return vs[n/2], n
		}
		return (vs[n/2-1] + vs[n/2]) / 2, n
	}
	return 0, 0
}

// neighbours returns up to k records nearest to p by profile, of p's Kind (of any kind when
// none is), that keep what their users asked for.
func neighbours(p JobProfile, recs []JobRecord, k int) []JobRecord {
	var out []JobRecord
	for pass := range 2 {
		for _, r := range recs {
			if r.Profile.requested() && (pass == 1 || r.Profile.Kind == p.Kind) {
				out = append(out, r)
			}
		}
		if len(out) > 0 {
			break
		}
	}
	slices.SortStableFunc(out, func(a, b JobRecord) int {
		return cmpFloat(p.distance(a.Profile), p.distance(b.Profile))
	})
	return out[:min(k, len(out))]
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// bound is a measured value, or a lower bound on it (the process used all it had).
type bound struct {
	v       float64
	atLeast bool
}

// quantile returns the q-quantile of the values by the Kaplan-Meier estimate of their
// distribution, the lower bounds counted as censored; ok is false when the estimate does not
// reach q (too many of the largest values are lower bounds) or there are no values. Of n
// values the estimate must reach q(n+1)/n: the k-th smallest of n values is above a value
// drawn from their distribution k/(n+1) of the time, so a high quantile of a few records is
// their largest, not a value a tenth of new jobs exceed.
func quantile(vs []bound, q float64) (float64, bool) {
	if n := float64(len(vs)); n > 0 {
		q = min(1, q*(n+1)/n)
	}
	vs = slices.Clone(vs)
	slices.SortFunc(vs, func(a, b bound) int {
		if c := cmpFloat(a.v, b.v); c != 0 {
			return c
		}
		switch {
		case a.atLeast == b.atLeast:
			return 0
		case !a.atLeast:
			return -1 // at a tie an exact value comes first: the bound may be above it
		}
		return 1
	})
	surv, risk := 1.0, float64(len(vs))
	for _, b := range vs {
		if !b.atLeast {
			surv *= 1 - 1/risk
			if 1-surv >= q-1e-12 {
				return b.v, true
			}
		}
		risk--
	}
	return 0, false
}

// quantileAtLeast is quantile, or, where the estimate does not reach q because the largest
// values are lower bounds, the largest value: the quantile is at least that.
func quantileAtLeast(vs []bound, q float64) (float64, bool) {
	if v, ok := quantile(vs, q); ok || len(vs) == 0 {
		return v, ok
	}
	return slices.MaxFunc(vs, func(a, b bound) int { return cmpFloat(a.v, b.v) }).v, true
}

// nearest returns the record whose profile is closest to p, within max, preferring records
// of p's Kind.
func nearest(p JobProfile, recs []JobRecord, max float64) (JobRecord, float64, bool) {
	best, bestD, found := JobRecord{}, math.Inf(1), false
	for pass := range 2 {
		for _, r := range recs {
			if pass == 0 && r.Profile.Kind != p.Kind {
				continue
			}
			if d := p.distance(r.Profile); d <= max && d < bestD {
				best, bestD, found = r, d, true
			}
		}
		if found {
			break
		}
	}
	return best, bestD, found
}

// historyFile is the layout of a history file.
type historyFile struct {
	Version int         `json:"version"`
	Jobs    []JobRecord `json:"jobs"`
}

// LoadHistory reads the job records of the history file at path, oldest first; a missing
// file is an empty history.
func LoadHistory(path string) ([]JobRecord, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("autoscale: read history: %w", err)
	}
	var h historyFile
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("autoscale: history %s: %w", path, err)
	}
	if h.Version != 1 {
		return nil, fmt.Errorf("autoscale: history %s: version %d, want 1", path, h.Version)
	}
	return h.Jobs, nil
}

// AppendHistory adds rec to the history file at path, keeping the newest keep records (0:
// all), and replaces the file atomically: a crash leaves the old file or the new one, never a
// mix. Calls for one file must not run concurrently (a process owns its history).
func AppendHistory(path string, rec JobRecord, keep int) error {
	recs, err := LoadHistory(path)
	if err != nil {
		return err
	}
	recs = append(recs, rec)
	if keep > 0 && len(recs) > keep {
		recs = recs[len(recs)-keep:]
	}
	b, err := json.MarshalIndent(historyFile{Version: 1, Jobs: recs}, "", "  ")
	if err != nil {
		return fmt.Errorf("autoscale: encode history: %w", err)
	}
	return writeAtomic(path, append(b, '\n'))
}

// writeAtomic writes b to a temporary file beside path, syncs it, renames it over path and
// syncs the directory.
func writeAtomic(path string, b []byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("autoscale: write history: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(b); err != nil {
		return fmt.Errorf("autoscale: write history: %w", err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("autoscale: sync history: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("autoscale: close history: %w", err)
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("autoscale: replace history: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("autoscale: sync history directory: %w", err)
	}
	defer d.Close()
	if err = d.Sync(); err != nil {
		return fmt.Errorf("autoscale: sync history directory: %w", err)
	}
	return nil
}

// sizes is what the history says of a job's process sizes, from what the earlier jobs'
// processes used against their users' requests.
type sizes struct {
	// shape has the request's counts and the sizes from the history (the server memory is
	// Begin's).
	shape Shape
	// perBytes is the server memory per model byte the earlier jobs of the kind measured,
	// ascending.
	perBytes []float64
	// minWorker and minServer are the median cores used of a request, times this one's.
	minWorker, minServer float64
	// workerCaps and serverCaps are the cores the records' processes used while they
	// worked over the cores their users asked for; asked the cores this job's user asked for
	// a worker and a server.
	workerCaps, serverCaps []float64
	asked                  [2]float64
	n                      int
	why                    string
}

// sizesFrom draws a job's process sizes from the records nb of earlier jobs, when the
// profile gives the user's request and there are HistoryMinNeighbours records: each role's
// cores are the CoreQuantile of the cores the records' processes used while they worked over
// their request, times this job's request (a role with fewer such records keeps its
// request); a worker's memory the MemoryQuantile of the records' peak over their request. No
// size is above the request. The server memory per model byte comes from every record of the
// profile's kind (all): what a byte of model costs in memory is the platform's (perBytes).
func (c *Config) sizesFrom(p JobProfile, nb, all []JobRecord) (sizes, bool) {
	if !p.requested() || len(nb) < c.HistoryMinNeighbours {
		return sizes{}, false
	}
	req := p.Request
	var wc, sc, wm []bound
	for _, r := range nb {
		rq := r.Profile.Request
		if r.WorkerCores > 0 && rq.Worker.CPU > 0 {
			wc = append(wc, bound{r.WorkerCores / rq.Worker.CPU, r.WorkerCoresAtLeast})
		}
		if r.ServerCores > 0 && rq.Server.CPU > 0 {
			sc = append(sc, bound{r.ServerCores / rq.Server.CPU, r.ServerCoresAtLeast})
		}
		if r.PeakWorkerMemory > 0 && rq.Worker.Memory > 0 {
			full := r.Shape.Worker.Memory > 0 && float64(r.PeakWorkerMemory) >= c.NearMemory*float64(r.Shape.Worker.Memory)
			wm = append(wm, bound{float64(r.PeakWorkerMemory) / float64(rq.Worker.Memory), full})
		}
	}
	out := sizes{shape: Shape{Workers: req.Workers, Servers: req.Servers, Worker: req.Worker, Server: Resources{CPU: req.Server.CPU}}, n: len(nb)}
	out.minWorker, out.minServer = c.MinProcess.CPU, c.MinProcess.CPU
	var why []string
	cores := func(role Role, vs []bound, r *Resources, floor *float64) {
		q, ok := quantileAtLeast(vs, c.CoreQuantile)
		med, okm := quantileAtLeast(vs, 0.5)
		if !ok || len(vs) < c.HistoryMinNeighbours {
			why = append(why, fmt.Sprintf("%ss as asked (%d records of their cores)", role, len(vs)))
			return
		}
		asked := r.CPU
		r.CPU = min(asked, max(roundUp(asked*q, c.CPUStep), c.MinProcess.CPU))
		if okm {
			*floor = min(asked, max(roundUp(asked*med, c.CPUStep), c.MinProcess.CPU))
		}
		why = append(why, fmt.Sprintf("%ss %g of the %g cores asked (%.0f%% quantile %.2f, median %.2f of the cores asked, used while working, over %d records)",
			role, r.CPU, asked, 100*c.CoreQuantile, q, med, len(vs)))
	}
	cores(Worker, wc, &out.shape.Worker, &out.minWorker)
	cores(Server, sc, &out.shape.Server, &out.minServer)
	if len(wc) >= c.HistoryMinNeighbours {
		out.workerCaps = values(wc)
	}
	if len(sc) >= c.HistoryMinNeighbours {
		out.serverCaps = values(sc)
	}
	out.asked = [2]float64{req.Worker.CPU, req.Server.CPU}
	if q, ok := quantile(wm, c.MemoryQuantile); ok && len(wm) >= c.HistoryMinNeighbours && req.Worker.Memory > 0 {
		out.shape.Worker.Memory = min(req.Worker.Memory, max(roundMiB(float64(req.Worker.Memory)*q), c.MinProcess.Memory))
		why = append(why, fmt.Sprintf("workers %.1f of the %.1f GiB asked (%.0f%% quantile %.2f of peak over request, %d records)",
			gib(out.shape.Worker.Memory), gib(req.Worker.Memory), 100*c.MemoryQuantile, q, len(wm)))
	}
	out.perBytes = perBytes(p.Kind, all)
	out.why = fmt.Sprintf("the user's %v, sized by what the %d nearest earlier jobs used of their requests: %s",
		req, len(nb), strings.Join(why, "; "))
	return out, true
}

func values(bs []bound) []float64 {
	vs := make([]float64, len(bs))
	for i, b := range bs {
		vs[i] = b.v
	}
	slices.Sort(vs)
	return vs
}

// sizeCores sets the cores of a first plan's workers and servers from the spread of the
// cores the earlier jobs' processes could use, against the prior model m: a process given c
// cores where it could use k takes max(1, k/c) times as long over its term of the step (the
// model's compute or serve term at the median k), so each role's expected term is that
// factor's mean over the records' k (their ratios times this job's request). From each
// role's least k, the role whose next k gains most is given it while the expected marginal
// efficiency is at least AddEfficiency; no role gets more than was asked. It returns s with
// the cores and why, in words; ok is false when either role has no spread.
func (c *Config) sizeCores(m Model, s Shape, sz sizes) (Shape, string, bool) {
	if len(sz.workerCaps) == 0 || len(sz.serverCaps) == 0 || sz.asked[0] <= 0 || sz.asked[1] <= 0 {
		return s, "", false
	}
	caps := [2][]float64{sz.workerCaps, sz.serverCaps}
	var cands [2][]float64
	for r := range 2 {
		for _, v := range caps[r] {
			k := min(sz.asked[r], max(roundUp(v*sz.asked[r], c.CPUStep), c.MinProcess.CPU))
			if n := len(cands[r]); n == 0 || k > cands[r][n-1] {
				cands[r] = append(cands[r], k)
			}
		}
	}
	med := func(vs []float64, asked float64) float64 { return vs[len(vs)/2] * asked }
	at := s
	at.Worker.CPU, at.Server.CPU = med(caps[0], sz.asked[0]), med(caps[1], sz.asked[1])
	mb := m
	mb.WorkerCores, mb.ServerCores = at.Worker.CPU, at.Server.CPU
	compute, serve, _ := mb.Terms(at)
	slow := func(r int, cores float64) float64 {
		var f float64
		for _, v := range caps[r] {
			f += max(1, v*sz.asked[r]/cores)
		}
		return f / float64(len(caps[r]))
	}
	x := func(sh Shape) float64 {
		_, _, rest := mb.Terms(sh)
		t := rest + compute*slow(0, sh.Worker.CPU) + serve*slow(1, sh.Server.CPU)
		if !(t > 0) {
			return 0
		}
		return float64(sh.Workers) / t
	}
	idx := [2]int{}
	s.Worker.CPU, s.Server.CPU = cands[0][0], cands[1][0]
	for {
		best, bestE := -1, c.AddEfficiency
		for r := range 2 {
			if idx[r]+1 >= len(cands[r]) {
				continue
			}
			to := s
			if r == 0 {
				to.Worker.CPU = cands[0][idx[0]+1]
			} else {
				to.Server.CPU = cands[1][idx[1]+1]
			}
			if e := c.marginal(x(s), x(to), s, to); e >= bestE {
				best, bestE = r, e
			}
		}
		if best < 0 {
			break
		}
		idx[best]++
		if best == 0 {
			s.Worker.CPU = cands[0][idx[0]]
		} else {
			s.Server.CPU = cands[1][idx[1]]
		}
	}
	share := func(r int, cores float64) float64 {
		n := 0
		for _, v := range caps[r] {
			if v*sz.asked[r] > cores*(1+saturated) {
				n++
			}
		}
		return 100 * float64(n) / float64(len(caps[r]))
	}
	why := fmt.Sprintf("cores where one more step of the spread the records used is worth less than %.2f of the job's throughput per resource, by the model's compute and serve terms (%.3g and %.3g us/sample at the median): workers %g of the %g asked (%.0f%% of the records could use more), servers %g of the %g asked (%.0f%%)",
		c.AddEfficiency, compute*1e6, serve*1e6, s.Worker.CPU, sz.asked[0], share(0, s.Worker.CPU), s.Server.CPU, sz.asked[1], share(1, s.Server.CPU))
	return s, why, true
}

// medianModel returns the model whose every coefficient is the median of the models of the
// records within max of p (those of p's Kind when any), and whose it is in words; nil when
// none has a model. The records' bounds on cores are their jobs' own and are left out.
func medianModel(p JobProfile, recs []JobRecord, max float64) (*Model, string) {
	var ms []Model
	var names []string
	for pass := range 2 {
		for _, r := range recs {
			if r.Model != nil && p.distance(r.Profile) <= max && (pass == 1 || r.Profile.Kind == p.Kind) {
				ms = append(ms, *r.Model)
				names = append(names, r.Job)
			}
		}
		if len(ms) > 0 {
			break
		}
	}
	switch len(ms) {
	case 0:
		return nil, ""
	case 1:
		m := ms[0]
		m.WorkerCores, m.ServerCores = 0, 0
		return &m, fmt.Sprintf("the model of %s (within profile distance %.2f)", names[0], max)
	}
	var c [nterms]float64
	for k := range nterms {
		vs := make([]float64, len(ms))
		for i, m := range ms {
			vs[i] = m.coef()[k]
		}
		slices.Sort(vs)
		n := len(vs)
		c[k] = vs[n/2]
		if n%2 == 0 {
			c[k] = (vs[n/2-1] + vs[n/2]) / 2
		}
	}
	m := modelOf(c[:])
	return &m, fmt.Sprintf("the median model of %d earlier jobs within profile distance %.2f", len(ms), max)
}
