package main

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/elasticps/elasticps/examples/clustersim/sim"
)

// writeCharts draws, for each comparison, the JCT CDF of each policy and the cluster's
// utilisation over time, and for the DLRM comparisons the resources allocated and used per
// job; it returns the files written.
func writeCharts(dir string, cs []*sim.Comparison) ([]string, error) {
	var files []string
	save := func(p *plot.Plot, name string) error {
		path := filepath.Join(dir, name)
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return fmt.Errorf("chart %s: %w", name, err)
		}
		files = append(files, path)
		return nil
	}
	for i, c := range cs {
		n := i + 1
		p, err := jctCDF(c)
		if err != nil {
			return nil, err
		}
		if err := save(p, fmt.Sprintf("%d-jct-cdf.svg", n)); err != nil {
			return nil, err
		}
		if p, err = utilisation(c); err != nil {
			return nil, err
		}
		if err := save(p, fmt.Sprintf("%d-utilisation.svg", n)); err != nil {
			return nil, err
		}
		if c.Workload.Jobs[0].Kind == sim.PS {
			if p, err = allocatedVsUsed(c); err != nil {
				return nil, err
			}
			if err := save(p, fmt.Sprintf("%d-allocated-vs-used.svg", n)); err != nil {
				return nil, err
			}
		}
	}
	return files, nil
}

func title(c *sim.Comparison, what string) string {
	return fmt.Sprintf("%s\n%s (%s)", what, c.Name, c.Workload.Name)
}

// jctCDF is the fraction of a run's jobs completed within each completion time (hours, log).
func jctCDF(c *sim.Comparison) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title(c, "JCT CDF")
	p.X.Label.Text = "job completion time (hours)"
	p.Y.Label.Text = "fraction of jobs"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	for i, r := range c.Results {
		jcts := r.JCTs()
		if len(jcts) == 0 {
			continue
		}
		pts := make(plotter.XYs, len(jcts))
		for k, j := range jcts {
			pts[k] = plotter.XY{X: math.Max(j/3600, 1e-3), Y: float64(k+1) / float64(len(r.Jobs))}
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.Color, l.Dashes = plotutil.Color(i), plotutil.Dashes(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(r.Policy, l)
	}
	return p, nil
}

// utilisation is, over time, the share of the cluster's main resource the jobs were
// allocated (solid) and, for CPU, used (dashed).
func utilisation(c *sim.Comparison) (*plot.Plot, error) {
	p := plot.New()
	gpu := c.Workload.Jobs[0].Kind == sim.GPU
	what := "CPU allocated (solid) and used (dashed) over the cluster's cores"
	if gpu {
		what = "GPUs allocated over the cluster's GPUs"
	}
	p.Title.Text = title(c, what)
	p.X.Label.Text = "time (hours)"
	p.Y.Label.Text = "share of the cluster"
	p.Y.Min, p.Y.Max = 0, 1
	for i, r := range c.Results {
		alloc, used := make(plotter.XYs, 0, len(r.Series)), make(plotter.XYs, 0, len(r.Series))
		// One point per 10 ticks keeps the files small.
		for k := 0; k < len(r.Series); k += 10 {
			s := r.Series[k]
			x := s.T / 3600
			if gpu {
				alloc = append(alloc, plotter.XY{X: x, Y: s.GPUAlloc / r.Capacity.GPU})
			} else {
				alloc = append(alloc, plotter.XY{X: x, Y: s.CPUAlloc / r.Capacity.CPU})
				used = append(used, plotter.XY{X: x, Y: s.CPUUsed / r.Capacity.CPU})
			}
		}
		if len(alloc) < 2 {
			continue
		}
		l, err := plotter.NewLine(alloc)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		p.Add(l)
		p.Legend.Add(r.Policy, l)
		if len(used) >= 2 {
			u, err := plotter.NewLine(used)
			if err != nil {
				return nil, err
			}
			u.Color, u.Dashes = plotutil.Color(i), []vg.Length{vg.Points(3), vg.Points(3)}
			p.Add(u)
		}
	}
	return p, nil
}

// allocatedVsUsed plots, per job, the core-hours it was allocated against those it used, one
// colour per policy, with the diagonal where everything allocated is used.
func allocatedVsUsed(c *sim.Comparison) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title(c, "CPU per job: allocated vs used (core-hours, log)")
	p.X.Label.Text = "allocated core-hours"
	p.Y.Label.Text = "used core-hours"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	lo, hi := math.Inf(1), 0.0
	for i, r := range c.Results {
		var pts plotter.XYs
		for _, j := range r.Jobs {
			if j.AllocCPU <= 0 || j.UsedCPU <= 0 {
				continue
			}
			x, y := j.AllocCPU/3600, j.UsedCPU/3600
			pts = append(pts, plotter.XY{X: x, Y: y})
			lo, hi = math.Min(lo, math.Min(x, y)), math.Max(hi, x)
		}
		if len(pts) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return nil, err
		}
		sc.GlyphStyle.Color = plotutil.Color(i)
		sc.GlyphStyle.Shape = plotutil.Shape(i)
		sc.GlyphStyle.Radius = vg.Points(2)
		p.Add(sc)
		p.Legend.Add(strings.TrimSpace(r.Policy), sc)
	}
	if hi > 0 {
		d, err := plotter.NewLine(plotter.XYs{{X: lo, Y: lo}, {X: hi, Y: hi}})
		if err != nil {
			return nil, err
		}
		d.Color = color.Gray{Y: 160}
		p.Add(d)
	}
	return p, nil
}
