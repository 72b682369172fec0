package sim

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// ErrBadTrace is wrapped by every ParseError: a trace file that does not have the layout its
// parser expects.
var ErrBadTrace = errors.New("clustersim: bad trace")

// ParseError says where in which trace file a record was malformed.
type ParseError struct {
	File string // the name the file was opened by
	Line int    // 1-based line of the record, 0 for the whole file
	Err  error
}

func (e *ParseError) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %v", e.File, e.Err)
	}
	return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
}

func (e *ParseError) Unwrap() []error { return []error{ErrBadTrace, e.Err} }

func parseErr(file string, line int, format string, args ...any) error {
	return &ParseError{File: file, Line: line, Err: fmt.Errorf(format, args...)}
}

// csvTable reads a comma-separated file with a header row and hands each record to row
// with its line number and a field getter by column name. Blank lines are skipped.
func csvTable(file string, r io.Reader, want []string, row func(line int, get func(string) string) error) error {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err == io.EOF {
		return parseErr(file, 1, "empty file, want a header with %s", strings.Join(want, ","))
	}
	if err != nil {
		return csvErr(file, err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(h)] = i
	}
	var missing []string
	for _, w := range want {
		if _, ok := col[w]; !ok {
			missing = append(missing, w)
		}
	}
	if len(missing) > 0 {
		return parseErr(file, 1, "header lacks column %s", strings.Join(missing, ", "))
	}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return csvErr(file, err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		if len(rec) != len(head) {
			return parseErr(file, line, "%d fields, want %d", len(rec), len(head))
		}
		get := func(name string) string { return strings.TrimSpace(rec[col[name]]) }
		if err := row(line, get); err != nil {
			return err
		}
	}
}

func csvErr(file string, err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return parseErr(file, pe.Line, "%v", pe.Err)
	}
	return &ParseError{File: file, Err: err}
}

// number parses a finite float; an empty or "nan" field is an error unless allowNaN.
func number(file string, line int, name, s string, allowNaN bool) (float64, error) {
	if allowNaN && (s == "" || strings.EqualFold(s, "nan")) {
		return math.NaN(), nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, parseErr(file, line, "%s %q is not a number", name, s)
	}
	return v, nil
}

// PhillyJob is one row of Pollux's copy of the Microsoft Philly trace (philly.csv).
type PhillyJob struct {
	Submit   time.Time
	Duration float64 // seconds the job ran
	GPUs     int
	Cluster  string // the virtual cluster's hash
	Line     int
}

// ParsePhilly reads philly.csv (timestamp,duration,num_gpus,gpu_time,cluster), in file order.
func ParsePhilly(file string, r io.Reader) ([]PhillyJob, error) {
	var out []PhillyJob
	err := csvTable(file, r, []string{"timestamp", "duration", "num_gpus", "cluster"}, func(line int, get func(string) string) error {
		ts, err := time.Parse("2006-01-02 15:04:05", get("timestamp"))
		if err != nil {
			return parseErr(file, line, "timestamp %q: want YYYY-MM-DD hh:mm:ss", get("timestamp"))
		}
		d, err := number(file, line, "duration", get("duration"), false)
		if err != nil {
			return err
		}
		g, err := strconv.Atoi(strings.TrimSuffix(get("num_gpus"), ".0"))
		if err != nil || g <= 0 {
			return parseErr(file, line, "num_gpus %q is not a positive integer", get("num_gpus"))
		}
		if d < 0 {
			return parseErr(file, line, "negative duration %v", d)
		}
		out = append(out, PhillyJob{Submit: ts, Duration: d, GPUs: g, Cluster: get("cluster"), Line: line})
		return nil
	})
	return out, err
}

// PolluxJob is one row of a Pollux 160-job workload (name,time,application,num_replicas,batch_size).
type PolluxJob struct {
	Name        string
	Time        float64 // submission, seconds from the workload's start
	Application string  // cifar10, ncf, deepspeech2, yolov3, imagenet, bert
	Replicas    int     // GPUs the user asked for
	BatchSize   int     // global batch size the user asked for
	Line        int
}

// ParsePolluxWorkload reads a Pollux workload-N.csv.
func ParsePolluxWorkload(file string, r io.Reader) ([]PolluxJob, error) {
	var out []PolluxJob
	err := csvTable(file, r, []string{"name", "time", "application", "num_replicas", "batch_size"}, func(line int, get func(string) string) error {
		t, err := number(file, line, "time", get("time"), false)
		if err != nil {
			return err
		}
		n, err1 := strconv.Atoi(get("num_replicas"))
		b, err2 := strconv.Atoi(get("batch_size"))
		if err1 != nil || err2 != nil || n <= 0 || b <= 0 || t < 0 {
			return parseErr(file, line, "num_replicas %q, batch_size %q and time %q must be positive", get("num_replicas"), get("batch_size"), get("time"))
		}
		if get("application") == "" {
			return parseErr(file, line, "empty application")
		}
		out = append(out, PolluxJob{Name: get("name"), Time: t, Application: get("application"), Replicas: n, BatchSize: b, Line: line})
		return nil
	})
	return out, err
}

// ScalePoint is one measurement of Pollux's scalability.csv: the step time of a data-parallel
// job on Replicas GPUs over Nodes machines with LocalBatch samples per GPU.
type ScalePoint struct {
	Nodes, Replicas, LocalBatch int
	StepTime, SyncTime          float64 // seconds
}

// ParseScalability reads scalability.csv (num_nodes,num_replicas,local_bsz,step_time,sync_time).
func ParseScalability(file string, r io.Reader) ([]ScalePoint, error) {
	var out []ScalePoint
	err := csvTable(file, r, []string{"num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"}, func(line int, get func(string) string) error {
		nn, err1 := strconv.Atoi(get("num_nodes"))
		nr, err2 := strconv.Atoi(get("num_replicas"))
		lb, err3 := strconv.Atoi(get("local_bsz"))
		if err1 != nil || err2 != nil || err3 != nil || nn <= 0 || nr <= 0 || lb <= 0 {
			return parseErr(file, line, "num_nodes %q, num_replicas %q, local_bsz %q must be positive integers", get("num_nodes"), get("num_replicas"), get("local_bsz"))
		}
		st, sy, err := stepSync(file, line, get)
		if err != nil {
			return err
		}
		out = append(out, ScalePoint{Nodes: nn, Replicas: nr, LocalBatch: lb, StepTime: st, SyncTime: sy})
		return nil
	})
	return out, err
}

// stepSync reads a line's step_time (positive) and sync_time (not negative), in seconds.
func stepSync(file string, line int, get func(string) string) (step, sync float64, err error) {
	if step, err = number(file, line, "step_time", get("step_time"), false); err != nil {
		return 0, 0, err
	}
	if sync, err = number(file, line, "sync_time", get("sync_time"), false); err != nil {
		return 0, 0, err
	}
	if step <= 0 || sync < 0 {
		return 0, 0, parseErr(file, line, "step_time %v must be positive and sync_time %v not negative", step, sync)
	}
	return step, sync, nil
}

// GavelJob is one line of a Gavel Philly-derived trace (seed=0/<vc>.trace).
type GavelJob struct {
	JobType     string  // e.g. "Recommendation (batch size 8192)"
	Steps       int64   // total_steps
	Arrival     float64 // seconds
	ScaleFactor int     // GPUs
	Line        int
}

// ParseGavelTrace reads a tab-separated Gavel trace of 7 fields per line: job_type, command,
// num_steps_arg, needs_data_dir, total_steps, arrival_time_s, scale_factor.
func ParseGavelTrace(file string, r io.Reader) ([]GavelJob, error) {
	var out []GavelJob
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(text) == "" {
			continue
		}
		f := strings.Split(text, "\t")
		if len(f) != 7 {
			return nil, parseErr(file, line, "%d tab-separated fields, want 7", len(f))
		}
		steps, err := strconv.ParseInt(strings.TrimSpace(f[4]), 10, 64)
		if err != nil || steps <= 0 {
			return nil, parseErr(file, line, "total_steps %q is not a positive integer", f[4])
		}
		at, err := number(file, line, "arrival_time_s", strings.TrimSpace(f[5]), false)
		if err != nil {
			return nil, err
		}
		sf, err := strconv.Atoi(strings.TrimSpace(f[6]))
		if err != nil || sf <= 0 || at < 0 {
			return nil, parseErr(file, line, "scale_factor %q must be a positive integer and arrival %v not negative", f[6], at)
		}
		if strings.TrimSpace(f[0]) == "" {
			return nil, parseErr(file, line, "empty job type")
		}
		out = append(out, GavelJob{JobType: strings.TrimSpace(f[0]), Steps: steps, Arrival: at, ScaleFactor: sf, Line: line})
	}
	if err := sc.Err(); err != nil {
		return nil, &ParseError{File: file, Line: line + 1, Err: err}
	}
	return out, nil
}

// GavelThroughputs holds Gavel's measured steps per second of each job type running alone,
// by GPU type, job type and scale factor (GPUs).
type GavelThroughputs map[string]map[string]map[int]float64

// Of returns the isolated steps/s of jobType on scale GPUs of gpu, and whether it was measured.
func (g GavelThroughputs) Of(gpu, jobType string, scale int) (float64, bool) {
	v, ok := g[gpu][jobType][scale]
	return v, ok
}

// ParseGavelThroughputs reads simulation_throughputs.json: {gpu: {"('type', sf)": {"null":
// steps/s, "('other', sf)": [..] (co-located pairs, ignored)}}}.
func ParseGavelThroughputs(file string, r io.Reader) (GavelThroughputs, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, &ParseError{File: file, Err: err}
	}
	var raw map[string]map[string]map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		line := 0
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			line = 1 + bytes.Count(data[:min(int(se.Offset), len(data))], []byte("\n"))
		case errors.As(err, &te):
			line = 1 + bytes.Count(data[:min(int(te.Offset), len(data))], []byte("\n"))
		}
		return nil, &ParseError{File: file, Line: line, Err: err}
	}
	out := GavelThroughputs{}
	for gpu, jobs := range raw {
		for key, pairs := range jobs {
			jt, sf, ok := parseGavelKey(key)
			if !ok {
				return nil, parseErr(file, lineOf(data, key), "job key %q: want ('type', scale)", key)
			}
			iso, ok := pairs["null"]
			if !ok {
				continue
			}
			var v float64
			if err := json.Unmarshal(iso, &v); err != nil || v < 0 || math.IsInf(v, 0) {
				return nil, parseErr(file, lineOf(data, key), "%s %s: isolated throughput %s is not a number >= 0", gpu, key, iso)
			}
			if v == 0 { // not measured (a few k80 entries)
				continue
			}
			if out[gpu] == nil {
				out[gpu] = map[string]map[int]float64{}
			}
			if out[gpu][jt] == nil {
				out[gpu][jt] = map[int]float64{}
			}
			out[gpu][jt][sf] = v
		}
	}
	if len(out) == 0 {
		return nil, parseErr(file, 0, "no isolated throughputs")
	}
	return out, nil
}

// parseGavelKey splits "('ResNet-18 (batch size 16)', 2)".
func parseGavelKey(k string) (string, int, bool) {
	k = strings.TrimSpace(k)
	if !strings.HasPrefix(k, "('") || !strings.HasSuffix(k, ")") {
		return "", 0, false
	}
	i := strings.LastIndex(k, "',")
	if i < 2 {
		return "", 0, false
	}
	sf, err := strconv.Atoi(strings.TrimSpace(k[i+2 : len(k)-1]))
	if err != nil || sf <= 0 {
		return "", 0, false
	}
	return k[2:i], sf, true
}

// lineOf returns the line of the first occurrence of key in data (1 when absent).
func lineOf(data []byte, key string) int {
	q, _ := json.Marshal(key)
	i := bytes.Index(data, q)
	if i < 0 {
		return 1
	}
	return 1 + bytes.Count(data[:i], []byte("\n"))
}

// Instance is one row of Alibaba's 2025 disaggregated DLRM trace.
type Instance struct {
	Name    string
	Role    string // "CN" (CPU node, a parameter server here) or "HN" (GPU node, a worker here)
	App     string
	CPU     float64 // cores requested
	GPU     float64
	MemGiB  float64 // memory requested
	Created float64 // seconds from the trace's start; NaN before it
	Deleted float64 // NaN after the trace's end
	Line    int
}

// ParseAlibabaDLRM reads disaggregated_DLRM_trace.csv.
func ParseAlibabaDLRM(file string, r io.Reader) ([]Instance, error) {
	var out []Instance
	err := csvTable(file, r, []string{"instance_sn", "role", "app_name", "cpu_request", "gpu_request", "memory_request", "creation_time", "deletion_time"}, func(line int, get func(string) string) error {
		role := get("role")
		if role != "CN" && role != "HN" {
			return parseErr(file, line, "role %q: want CN or HN", role)
		}
		in := Instance{Name: get("instance_sn"), Role: role, App: get("app_name"), Line: line}
		var err error
		if in.CPU, err = number(file, line, "cpu_request", get("cpu_request"), false); err != nil {
			return err
		}
		if in.GPU, err = number(file, line, "gpu_request", get("gpu_request"), false); err != nil {
			return err
		}
		if in.MemGiB, err = number(file, line, "memory_request", get("memory_request"), false); err != nil {
			return err
		}
		if in.Created, err = number(file, line, "creation_time", get("creation_time"), true); err != nil {
			return err
		}
		if in.Deleted, err = number(file, line, "deletion_time", get("deletion_time"), true); err != nil {
			return err
		}
		if in.CPU <= 0 || in.MemGiB <= 0 || in.GPU < 0 || in.App == "" {
			return parseErr(file, line, "cpu_request %v and memory_request %v must be positive, app_name set", in.CPU, in.MemGiB)
		}
		out = append(out, in)
		return nil
	})
	return out, err
}

// Machine is one row of Alibaba PAI's pai_machine_spec.csv (no header:
// machine,gpu_type,cap_cpu,cap_mem,cap_gpu).
type Machine struct {
	GPUType string
	Resources
}

// ParseMachineSpec reads pai_machine_spec.csv.
func ParseMachineSpec(file string, r io.Reader) ([]Machine, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	var out []Machine
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, csvErr(file, err)
		}
		line, _ := cr.FieldPos(0)
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		if len(rec) != 5 {
			return nil, parseErr(file, line, "%d fields, want 5 (machine,gpu_type,cap_cpu,cap_mem,cap_gpu)", len(rec))
		}
		var m Machine
		m.GPUType = strings.TrimSpace(rec[1])
		if m.CPU, err = number(file, line, "cap_cpu", strings.TrimSpace(rec[2]), false); err != nil {
			return nil, err
		}
		if m.Mem, err = number(file, line, "cap_mem", strings.TrimSpace(rec[3]), false); err != nil {
			return nil, err
		}
		if m.GPU, err = number(file, line, "cap_gpu", strings.TrimSpace(rec[4]), false); err != nil {
			return nil, err
		}
		if m.CPU <= 0 || m.Mem <= 0 || m.GPU < 0 {
			return nil, parseErr(file, line, "capacities %v must be positive", m.Resources)
		}
		out = append(out, m)
	}
}

// Placement parses a Pollux placements.csv file (placement,local_bsz,step_time,sync_time),
// where placement lists the GPUs used on each node ("44" is two nodes of four), into scale
// points.
func ParsePlacements(file string, r io.Reader) ([]ScalePoint, error) {
	var out []ScalePoint
	err := csvTable(file, r, []string{"placement", "local_bsz", "step_time", "sync_time"}, func(line int, get func(string) string) error {
		pl := get("placement")
		nodes, reps := 0, 0
		for _, ch := range pl {
			if ch < '1' || ch > '9' {
				return parseErr(file, line, "placement %q: want a digit 1-9 per node", pl)
			}
			nodes++
			reps += int(ch - '0')
		}
		if nodes == 0 {
			return parseErr(file, line, "empty placement")
		}
		lb, err := strconv.Atoi(get("local_bsz"))
		if err != nil || lb <= 0 {
			return parseErr(file, line, "local_bsz %q is not a positive integer", get("local_bsz"))
		}
		st, sy, err := stepSync(file, line, get)
		if err != nil {
			return err
		}
		out = append(out, ScalePoint{Nodes: nodes, Replicas: reps, LocalBatch: lb, StepTime: st, SyncTime: sy})
		return nil
	})
	return out, err
}
