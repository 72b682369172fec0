package statuspage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/elasticps/elasticps/elastic"
)

// Source is what the page reads the job from: *elastic.Coordinator in the coordinator's
// process, or anything else that tells a job's status (a test feeds its own). Status is called
// from the page's sampling loop, once a sample, and must be safe for concurrent use with the
// job's other callers.
//
// A Source that can also read the servers' counters (elastic.Coordinator.Usage; see
// UsageSource) has them read each sample, which fills the servers' host, CPU and memory.
type Source interface {
	Status() elastic.Status
}

// SourceFunc is a Source that calls itself: statuspage.SourceFunc(job.Coordinator().Status),
// or a function that finds the current coordinator each time.
type SourceFunc func() elastic.Status

// Status calls f.
func (f SourceFunc) Status() elastic.Status { return f() }

// UsageSource is a Source that reads every server's counters: *elastic.Coordinator. Usage may
// block on the network; the page gives it at most Config.Every, and takes Status instead when
// it fails.
type UsageSource interface {
	Source
	Usage(ctx context.Context) (elastic.Status, error)
}

var _ UsageSource = (*elastic.Coordinator)(nil)

// Config configures a Page. The zero value of every field means its default.
type Config struct {
	// Source is the job the page shows. Nil: set it with SetSource (a page made before its
	// coordinator, whose callbacks it is); until then the page has nothing to sample.
	Source Source
	// Secret is the cluster secret, from which the page's access token is derived (Token).
	// Required to serve on an address other than loopback (Serve), and by Handler(true),
	// which refuses every request without it.
	Secret []byte
	// Every is the sample period: how often the page reads the Source, closes a point of
	// every series, and how often an open page refreshes itself. Default 1 s. Shorter is
	// livelier and costs a Status (and a Usage, reaching every server) each time.
	Every time.Duration
	// History is how many points each chart keeps, the newest; default 600 (ten minutes at
	// the default period). Memory is bounded by it and MaxSeries.
	History int
	// Events is how many checkpoints, recoveries and events (scaling, membership) the page
	// keeps, the newest of each; default 100.
	Events int
	// MaxSeries bounds the number of series a program may Observe (beyond the throughput
	// the page measures itself); values of further series are dropped. Default 8.
	MaxSeries int
	// NoUsage reads the Source's Status only, never its Usage: the member list then has no
	// host, CPU or memory of the servers, and sampling reaches no server. Default false: a
	// UsageSource's Usage is read each sample.
	NoUsage bool
	// Now is the page's clock; nil: time.Now.
	Now func() time.Time
	// Logger receives the page's warnings (a failed Usage, a series refused); nil discards.
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultEvery     = time.Second
	DefaultHistory   = 600
	DefaultEvents    = 100
	DefaultMaxSeries = 8
)

// ErrInvalidConfig is returned by New for a Config that cannot work, and by Serve for a page
// without a secret on an address other than loopback.
var ErrInvalidConfig = errors.New("statuspage: invalid config")

// withDefaults returns cfg with every zero field set to its default.
func (cfg Config) withDefaults() Config {
	if cfg.Every == 0 {
		cfg.Every = DefaultEvery
	}
	if cfg.History == 0 {
		cfg.History = DefaultHistory
	}
	if cfg.Events == 0 {
		cfg.Events = DefaultEvents
	}
	if cfg.MaxSeries == 0 {
		cfg.MaxSeries = DefaultMaxSeries
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

// Validate reports every problem of cfg at once (ErrInvalidConfig).
func (cfg Config) Validate() error {
	var errs []error
	if cfg.Every < 0 {
		errs = append(errs, fmt.Errorf("Every %v is negative", cfg.Every))
	}
	if cfg.History < 0 {
		errs = append(errs, fmt.Errorf("History %d is negative", cfg.History))
	}
	if cfg.Events < 0 {
		errs = append(errs, fmt.Errorf("Events %d is negative", cfg.Events))
	}
	if cfg.MaxSeries < 0 {
		errs = append(errs, fmt.Errorf("MaxSeries %d is negative", cfg.MaxSeries))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}
