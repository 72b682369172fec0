package sim

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Paths of the trace files under the traces directory (../shared/data/traces from the
// repository's root). Each folder there has ORIGIN.md with its source and licence.
const (
	PhillyPath          = "pollux-philly/simulator/traces/philly.csv"
	PolluxWorkloadsDir  = "pollux-philly/simulator/workloads"
	PolluxProfilesDir   = "pollux-philly/simulator/traces"
	GavelTracesDir      = "gavel/scheduler/traces/msr/seed=0"
	GavelThroughputPath = "gavel/scheduler/simulation_throughputs.json"
	AlibabaDLRMPath     = "alibaba/v2025/disaggregated_DLRM_trace.csv"
	MachineSpecPath     = "alibaba/v2020/data/pai_machine_spec.csv"
)

// PolluxProfile is the measured speed of one Pollux application: step times by GPU count and
// local batch size, and the batch sizes at which Pollux validated its statistical efficiency.
type PolluxProfile struct {
	Points    []ScalePoint
	Validated []int // ascending global batch sizes with a validation-N.csv
}

// Traces is every input the simulator reads.
type Traces struct {
	Philly          []PhillyJob // sorted by submission time
	PolluxWorkloads map[int][]PolluxJob
	PolluxProfiles  map[string]*PolluxProfile // by application
	Gavel           map[string][]GavelJob     // by virtual cluster (the trace file's name)
	GavelThroughput GavelThroughputs
	Alibaba         []Instance
	Machines        []Machine
}

// LoadTraces reads every trace the simulator uses from fsys, rooted at the traces directory.
// A missing or malformed file is an error naming it (a *ParseError with its line for bad
// content).
func LoadTraces(fsys fs.FS) (*Traces, error) {
	tr := &Traces{PolluxWorkloads: map[int][]PolluxJob{}, PolluxProfiles: map[string]*PolluxProfile{}, Gavel: map[string][]GavelJob{}}
	var err error
	if tr.Philly, err = load(fsys, PhillyPath, ParsePhilly); err != nil {
		return nil, err
	}
	slices.SortStableFunc(tr.Philly, func(a, b PhillyJob) int { return a.Submit.Compare(b.Submit) })
	if tr.GavelThroughput, err = load(fsys, GavelThroughputPath, ParseGavelThroughputs); err != nil {
		return nil, err
	}
	if tr.Alibaba, err = load(fsys, AlibabaDLRMPath, ParseAlibabaDLRM); err != nil {
		return nil, err
	}
	if tr.Machines, err = load(fsys, MachineSpecPath, ParseMachineSpec); err != nil {
		return nil, err
	}
	wl, err := fs.Glob(fsys, PolluxWorkloadsDir+"/workload-*.csv")
	if err != nil {
		return nil, err
	}
	for _, f := range wl {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(path.Base(f), "workload-"), ".csv"))
		if err != nil {
			continue
		}
		if tr.PolluxWorkloads[n], err = load(fsys, f, ParsePolluxWorkload); err != nil {
			return nil, err
		}
	}
	if len(tr.PolluxWorkloads) == 0 {
		return nil, fmt.Errorf("clustersim: no Pollux workloads under %s", PolluxWorkloadsDir)
	}
	apps, err := fs.ReadDir(fsys, PolluxProfilesDir)
	if err != nil {
		return nil, err
	}
	for _, a := range apps {
		if !a.IsDir() {
			continue
		}
		dir := path.Join(PolluxProfilesDir, a.Name())
		p := &PolluxProfile{}
		if p.Points, err = load(fsys, path.Join(dir, "scalability.csv"), ParseScalability); err != nil {
			return nil, err
		}
		pl, err := load(fsys, path.Join(dir, "placements.csv"), ParsePlacements)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		p.Points = append(p.Points, pl...)
		vs, _ := fs.Glob(fsys, dir+"/validation-*.csv")
		for _, v := range vs {
			if b, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(path.Base(v), "validation-"), ".csv")); err == nil {
				p.Validated = append(p.Validated, b)
			}
		}
		slices.Sort(p.Validated)
		tr.PolluxProfiles[a.Name()] = p
	}
	gs, err := fs.Glob(fsys, GavelTracesDir+"/*.trace")
	if err != nil {
		return nil, err
	}
	for _, g := range gs {
		jobs, err := load(fsys, g, ParseGavelTrace)
		if err != nil {
			return nil, err
		}
		tr.Gavel[strings.TrimSuffix(path.Base(g), ".trace")] = jobs
	}
	if len(tr.Gavel) == 0 {
		return nil, fmt.Errorf("clustersim: no Gavel traces under %s", GavelTracesDir)
	}
	return tr, nil
}

func load[T any](fsys fs.FS, name string, parse func(string, io.Reader) (T, error)) (T, error) {
	var zero T
	f, err := fsys.Open(name)
	if err != nil {
		return zero, err
	}
	defer f.Close()
	return parse(name, f)
}
