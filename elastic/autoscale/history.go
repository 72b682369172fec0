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
	// BatchSize is the samples per step of a worker.
	BatchSize int `json:"batch_size"`
}

func (p JobProfile) validate() error {
	if p.ModelBytes <= 0 || p.BatchSize <= 0 || p.DatasetSamples < 0 {
		return fmt.Errorf("%w: %+v", ErrInvalidProfile, p)
	}
	return nil
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
	PeakWorkerMemory int64     `json:"peak_worker_memory,omitempty"`
	Finished         time.Time `json:"finished,omitzero"`
}

// memoryPerModelByte is the server memory the job took per byte of its model: its peak
// server memory times its servers over its model bytes.
func (r JobRecord) memoryPerModelByte() (float64, bool) {
	if r.PeakServerMemory <= 0 || r.Profile.ModelBytes <= 0 || r.Shape.Servers <= 0 {
		return 0, false
	}
	return float64(r.PeakServerMemory) * float64(r.Shape.Servers) / float64(r.Profile.ModelBytes), true
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
