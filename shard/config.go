package shard

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// MaxWorkerName is the longest worker name, in bytes, the dispatcher accepts.
const MaxWorkerName = 256

// MaxShardRecords is the largest shard, in records (offsets and shuffles fit in 31 bits).
const MaxShardRecords = 1<<31 - 1

// Clock tells the time. The dispatcher reads it on every call; tests inject a fake one.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Config configures a Dispatcher. The zero value of every field but Dataset means its default.
type Config struct {
	// Dataset is what to split into shards. Required.
	Dataset Dataset

	// ShardSize is the number of records per shard for KindIndexed and KindStream datasets (the
	// last shard of a dataset may be smaller; KindText shards are cut by SplitText). Default 8192.
	// Smaller shards balance load better and replay less after a failure, larger ones cost fewer
	// dispatcher calls. At most MaxShardRecords.
	ShardSize int64

	// Epochs is the number of passes over the dataset. Default 1. Must be 1 for a stream. An epoch
	// starts when every shard of the previous one is DONE or FAILED (an epoch barrier).
	Epochs int

	// Seed seeds the shard order of each epoch and the per-shard record shuffle. Default 0 (a
	// valid seed). Changing it changes the fingerprint a snapshot is checked against.
	Seed uint64

	// Shuffle hands shards out in a seeded random order that differs per epoch. Default false
	// (table order). Ignored for streams, which are served in the order they were cut.
	Shuffle bool

	// ShuffleRecords makes every lease carry a ShuffleSeed (derived from Seed, epoch and shard) so
	// that readers visit the records of a shard in a seeded random order. Default false.
	ShuffleRecords bool

	// LeaseTTL is how long a lease lives after its grant and after each accepted report, in
	// wall time. Default 30s. Shorter detects dead workers sooner; it must exceed the time a
	// worker needs between reports (a batch, or ReportEvery batches), or healthy workers lose
	// their shards.
	LeaseTTL time.Duration

	// MaxFailures is the number of times a shard may be lost by a worker (lease expired, worker
	// evicted, or lease revoked because the worker asked for more than MaxLeasesPerWorker) within
	// one epoch before it goes to FAILED. Default 3. A voluntary Leave does not count.
	MaxFailures int

	// MaxLeasesPerWorker is how many shards one worker may hold at once. Default 2, so that a
	// Reader can start the next shard while the last batches of the previous one are still
	// being trained (ReaderConfig.MaxLeases must not exceed it). When a worker holding that many
	// asks for another, its oldest lease is revoked (and counts as a failure): a worker that
	// asks again has lost track of what it held, typically because it restarted.
	MaxLeasesPerWorker int

	// RetryAfter is the longest wait a WaitError suggests. Default 250ms. The wait is cut to
	// the earliest lease deadline, when a shard may come back, and to when the shards being
	// trained are estimated done at their holders' measured speeds (at least 10ms), when the
	// next epoch's shards are leased. A Reader whose Service wakes it (ShardAwaiter: a
	// Dispatcher in the same process) asks again as soon as a shard comes free, whatever the
	// wait; over the network (shardnet) it waits as told. There a longer RetryAfter can leave a
	// worker idle at an epoch's start while its peers' speeds are not yet measured, a shorter
	// one costs each waiting worker more calls (four a second at the default). On small data of
	// many epochs the estimate does most of the work: two workers over the network take about
	// as long with any RetryAfter from 10ms to 1s, and in process the wake leaves none idle (the
	// elastic package's BenchmarkEpochEnds).
	RetryAfter time.Duration

	// RateWindow is the time constant of the per-worker speed estimate (an exponentially
	// weighted moving average of records per second). Default 30s.
	RateWindow time.Duration

	// Incarnation identifies this dispatcher instance inside every lease id it grants, so that
	// a worker still holding a lease of an earlier instance (before a coordinator restart and
	// Restore) is fenced off. Default 0: a random value. If set, it must differ between every
	// two instances that may serve the same workers (for example the coordinator's restart
	// count); never reuse one across restarts.
	Incarnation uint64

	// Clock supplies the time. Default: the system clock.
	Clock Clock

	// Logger receives epoch changes, failed shards and expired leases. Default: discard.
	Logger *slog.Logger
}

// DefaultConfig returns a Config for the dataset with every default filled in.
func DefaultConfig(ds Dataset) Config {
	c := Config{Dataset: ds}
	c.fill()
	return c
}

// fill replaces zero fields by their defaults (Incarnation, Clock and Logger are left to New).
func (c *Config) fill() {
	if c.ShardSize == 0 {
		c.ShardSize = 8192
	}
	if c.Epochs == 0 {
		c.Epochs = 1
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 30 * time.Second
	}
	if c.MaxFailures == 0 {
		c.MaxFailures = 3
	}
	if c.MaxLeasesPerWorker == 0 {
		c.MaxLeasesPerWorker = 2
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = 250 * time.Millisecond
	}
	if c.RateWindow == 0 {
		c.RateWindow = 30 * time.Second
	}
}

// Validate reports every problem of the configuration at once, joined with ErrInvalidConfig.
func (c Config) Validate() error {
	c.fill()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.ShardSize < 0 || c.ShardSize > MaxShardRecords {
		bad("ShardSize %d out of range [1, %d]", c.ShardSize, MaxShardRecords)
	}
	if c.Epochs < 0 {
		bad("Epochs %d is negative", c.Epochs)
	}
	if c.LeaseTTL < 0 {
		bad("LeaseTTL %v is negative", c.LeaseTTL)
	}
	if c.MaxFailures < 0 || c.MaxFailures > 1<<16 {
		bad("MaxFailures %d out of range [1, 65536]", c.MaxFailures)
	}
	if c.MaxLeasesPerWorker < 0 || c.MaxLeasesPerWorker > 1024 {
		bad("MaxLeasesPerWorker %d out of range [1, 1024]", c.MaxLeasesPerWorker)
	}
	if c.RetryAfter < 0 {
		bad("RetryAfter %v is negative", c.RetryAfter)
	}
	if c.RateWindow < 0 {
		bad("RateWindow %v is negative", c.RateWindow)
	}
	ds := c.Dataset
	switch ds.Kind {
	case KindIndexed:
		if ds.Records <= 0 {
			bad("indexed dataset: Records %d must be positive", ds.Records)
		}
	case KindText:
		if len(ds.Text) == 0 {
			bad("text dataset: no shards (use SplitText)")
		}
		if len(ds.Text) > 1<<31-1 {
			bad("text dataset: %d shards is too many", len(ds.Text))
		}
		for i, s := range ds.Text {
			switch {
			case s.Kind != KindText:
				bad("text dataset: shard %d has kind %v", i, s.Kind)
			case s.File == "":
				bad("text dataset: shard %d has no file", i)
			case s.Start < 0 || s.End <= s.Start:
				bad("text dataset: shard %d byte range [%d, %d) is empty or negative", i, s.Start, s.End)
			case s.Records <= 0 || s.Records > MaxShardRecords || s.Records > s.End-s.Start:
				bad("text dataset: shard %d record count %d impossible for %d bytes", i, s.Records, s.End-s.Start)
			case s.Line < 1:
				bad("text dataset: shard %d line %d must be >= 1", i, s.Line)
			}
		}
	case KindStream:
		if ds.Partitions <= 0 || ds.Partitions > 1<<20 {
			bad("stream dataset: Partitions %d out of range [1, %d]", ds.Partitions, 1<<20)
		}
		if len(ds.StreamStart) != 0 && len(ds.StreamStart) != ds.Partitions {
			bad("stream dataset: %d StreamStart offsets for %d partitions", len(ds.StreamStart), ds.Partitions)
		}
		for p, o := range ds.StreamStart {
			if o < 0 {
				bad("stream dataset: partition %d starts at negative offset %d", p, o)
			}
		}
		if c.Epochs > 1 {
			bad("stream dataset: Epochs must be 1, not %d", c.Epochs)
		}
	default:
		bad("Dataset.Kind %v unknown (use IndexedDataset, TextDataset or StreamDataset)", ds.Kind)
	}
	if ds.Kind == KindIndexed && c.ShardSize > 0 && ds.Records > 0 && (ds.Records+c.ShardSize-1)/c.ShardSize > 1<<31-1 {
		bad("indexed dataset: %d records in shards of %d makes too many shards", ds.Records, c.ShardSize)
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.Join(append([]error{ErrInvalidConfig}, errs...)...)
}
