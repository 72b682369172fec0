package statuspage

import (
	"maps"
	"slices"
	"time"

	"github.com/elasticps/elasticps/elastic"
)

// Snapshot is what the page shows: the JSON of its status endpoint, and what Fetch returns.
// A Snapshot shares nothing with the page it came from.
type Snapshot struct {
	// At is when the newest sample was taken (zero: none yet); Every is the sample period.
	At    time.Time     `json:"at"`
	Every time.Duration `json:"every_ns"`
	// Status is the job's status at the newest sample, with the servers' counters where the
	// page reads them (Config.NoUsage).
	Status elastic.Status `json:"status"`
	// Members are the job's parameter servers, then its workers, each by ID.
	Members []Member `json:"members"`
	// Series are the charts, each its newest points (Config.History), oldest first: the
	// throughput the page measures (SeriesThroughput) first, then the series a program
	// observes, in the order they first came.
	Series []Series `json:"series"`
	// Checkpoints are the newest checkpoints reported (Page.ObserveCheckpoint), oldest first.
	Checkpoints []Checkpoint `json:"checkpoints"`
	// Recoveries are the newest recoveries from server failures, oldest first: those
	// reported (Page.ObserveRecovery), and those the samples found in Status.LastRecovery.
	Recoveries []Recovery `json:"recoveries"`
	// Events are the newest changes the samples saw (servers and workers that came, failed or
	// left, plans, repartitions) and the recoveries and failed checkpoints reported, oldest
	// first.
	Events []Event `json:"events"`
}

// The roles of a Member.
const (
	RoleServer = "server"
	RoleWorker = "worker"
)

// The health of a Member: a server serves, has missed its last health checks (silent), or
// failed; a worker is in a batch or between two.
const (
	HealthServing = "serving"
	HealthSilent  = "silent"
	HealthFailed  = "failed"
	HealthBatch   = "batch"
	HealthIdle    = "idle"
)

// Member is a parameter server or a worker of the job.
type Member struct {
	Role string `json:"role"` // RoleServer or RoleWorker
	ID   string `json:"id"`
	// Addr is a server's RPC address; Host the host its process runs on, Pid its process id
	// (both from the servers' counters, where the page reads them).
	Addr   string `json:"addr,omitempty"`
	Host   string `json:"host,omitempty"`
	Pid    int    `json:"pid,omitempty"`
	Health string `json:"health"`
	// Reason is why a server failed.
	Reason string `json:"reason,omitempty"`
	// Incarnation is a server's process's.
	Incarnation uint64 `json:"incarnation,omitempty"`
	// Slots counts the slots a server owns in the served owner table; Migrating those of
	// them whose move (in or out) is under way.
	Slots     int `json:"slots,omitempty"`
	Migrating int `json:"migrating,omitempty"`
	// Unheard is how long ago the coordinator last heard from it.
	Unheard time.Duration `json:"unheard_ns"`
	// Steps counts a worker's batches; StepsPerSecond is its rate since the previous sample.
	Steps          uint64  `json:"steps,omitempty"`
	StepsPerSecond float64 `json:"steps_per_second,omitempty"`
	// CPU is the cores a server used since the previous sample (its process's CPU time where
	// the counters have it and the process is the server's alone, else its serving time);
	// Memory the bytes its process holds (its memory cgroup's charge where the cgroup has a
	// limit, else its resident memory; its tables' where the counters have neither or the
	// process is shared: elastic.ServerStatus.Use). Zero: not read.
	CPU    float64 `json:"cpu,omitempty"`
	Memory int64   `json:"memory_bytes,omitempty"`
}

// SeriesThroughput is the series the page measures itself: records trained per second, from
// the difference of Status.EpochDone between two samples. Observe refuses the name.
const SeriesThroughput = "throughput"

// Series is a chart's points.
type Series struct {
	Name string `json:"name"`
	// Unit is what a value counts ("records/s" for the throughput; empty for observed ones).
	Unit   string  `json:"unit,omitempty"`
	Points []Point `json:"points"`
}

// Point is a value at a time. An observed series has a point per sample period in which the
// program observed it, the mean of its values in that period.
type Point struct {
	At time.Time `json:"t"`
	V  float64   `json:"v"`
}

// Checkpoint is a flash checkpoint: its snapshot and, once reported, its commit.
type Checkpoint struct {
	Step uint64    `json:"step"`
	At   time.Time `json:"at"` // when the snapshot (else the commit) was reported
	// Bytes is what the servers copied into shared memory, Full whether any copy was full,
	// Blocked how long training was paused at the barrier.
	Bytes   int64         `json:"bytes"`
	Full    bool          `json:"full,omitempty"`
	Blocked time.Duration `json:"blocked_ns"`
	// Committed is set once the commit is written; CommitLag is the time from the snapshot
	// to its commit.
	Committed bool          `json:"committed,omitempty"`
	CommitLag time.Duration `json:"commit_lag_ns,omitempty"`
	// Err is the failure of the snapshot or the commit.
	Err string `json:"error,omitempty"`
}

// Recovery is a recovery from parameter-server failures (elastic.RecoveryEvent).
type Recovery struct {
	// At is when the first failure was noticed.
	At     time.Time `json:"at"`
	Policy string    `json:"policy"`
	// Failed are the servers that failed, with why; Replaced those a new incarnation took
	// over (the slots of the others went to the survivors).
	Failed   map[string]string `json:"failed"`
	Replaced []string          `json:"replaced,omitempty"`
	// Step is the commit restored (0: none); TableVersion the owner table published at the end.
	Step         uint64 `json:"step"`
	TableVersion uint64 `json:"table_version"`
	// Replacement is how long the wait for replacements took, Duration the time from the
	// failure until training went on.
	Replacement time.Duration `json:"replacement_ns"`
	Duration    time.Duration `json:"duration_ns"`
	// LostRecords counts, under the partial policy, the records whose updates to the restored
	// slots were lost, of TrainedRecords.
	LostRecords    int64 `json:"lost_records,omitempty"`
	TrainedRecords int64 `json:"trained_records,omitempty"`
	// Err is set when the attempt failed (the coordinator tries again).
	Err string `json:"error,omitempty"`
}

// The kinds of an Event.
const (
	EventJob         = "job"         // the page's first sample, the data finished, the coordinator stopped
	EventPlan        = "plan"        // a new plan (SetPlan, SetParallelism)
	EventRepartition = "repartition" // a change of the server count began, ended or failed
	EventServer      = "server"      // a server joined, failed, restarted or left
	EventWorker      = "worker"      // a worker joined or left
	EventRecovery    = "recovery"    // a recovery from server failures ended (or an attempt failed)
	EventCheckpoint  = "checkpoint"  // a snapshot or commit failed
)

// Event is a change in the job.
type Event struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"`
	Text string    `json:"text"`
}

// clone returns a copy of s that shares no slice or map with it.
func (s Snapshot) clone() Snapshot {
	s.Status = cloneStatus(s.Status)
	s.Members = slices.Clone(s.Members)
	s.Series = slices.Clone(s.Series)
	for i := range s.Series {
		s.Series[i].Points = slices.Clone(s.Series[i].Points)
	}
	s.Checkpoints = slices.Clone(s.Checkpoints)
	s.Recoveries = slices.Clone(s.Recoveries)
	for i := range s.Recoveries {
		s.Recoveries[i] = s.Recoveries[i].clone()
	}
	s.Events = slices.Clone(s.Events)
	return s
}

func (r Recovery) clone() Recovery {
	r.Failed = maps.Clone(r.Failed)
	r.Replaced = slices.Clone(r.Replaced)
	return r
}

// cloneStatus returns a copy of st that shares nothing with it, but for what no one changes
// (the strings).
func cloneStatus(st elastic.Status) elastic.Status {
	st.Servers = slices.Clone(st.Servers)
	st.Workers = slices.Clone(st.Workers)
	st.Owners = slices.Clone(st.Owners)
	st.Migrating = slices.Clone(st.Migrating)
	if st.Repartition != nil {
		r := *st.Repartition
		st.Repartition = &r
	}
	if st.LastRecovery != nil {
		r := *st.LastRecovery
		r.Failed = maps.Clone(r.Failed)
		r.Replaced = slices.Clone(r.Replaced)
		r.Lost = slices.Clone(r.Lost)
		r.Held = slices.Clone(r.Held)
		r.Skipped = slices.Clone(r.Skipped)
		r.Quarantined = slices.Clone(r.Quarantined)
		st.LastRecovery = &r
	}
	return st
}
