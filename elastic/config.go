package elastic

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// Config configures a Coordinator. The zero value of every field but Job, Servers and
// Dispatcher.Dataset means its default.
type Config struct {
	// Job names the job in checkpoint storage and shared memory (1-128 letters, digits, '.',
	// '_' or '-'). Required.
	Job string
	// Servers are the job's parameter servers. Required.
	Servers []ParameterServer
	// Slots is the job's slot count; it must match the servers'. Default ps.DefaultSlots.
	Slots int
	// Dispatcher configures the data-shard dispatcher; its Clock is the coordinator's (it stands
	// still while training is paused at a barrier). Dataset is required.
	Dispatcher shard.Config

	// Storage holds the commits (the servers' checkpointers write their parts there too). Nil:
	// no checkpoints (Checkpoint and Resume fail).
	Storage checkpoint.Storage
	// CheckpointEvery is the number of steps (batches applied and reported, by any worker)
	// between checkpoints. Default 0: none by steps.
	CheckpointEvery int
	// CheckpointInterval is the training time between checkpoints: a checkpoint is due when
	// CheckpointEvery steps or this much time have passed since the last one began, whichever
	// comes first, and a step has been trained since. Time spent paused at a barrier does not
	// count. A short interval bounds the training a failure loses, in time, whatever the job's
	// speed (steps alone leave a slow job long without one); each checkpoint pauses training for
	// its copy and persists its bytes, so a short one costs a slow job little and a fast one more
	// pauses and more storage traffic. Default 0: none by time. With neither, checkpoints are
	// taken only when Checkpoint is called.
	CheckpointInterval time.Duration
	// KeepLast is how many commits retention keeps. Default 3 (checkpoint.CommitterConfig).
	KeepLast int
	// Overwrite says what a coordinator that finds commits of an earlier run of the job in
	// Storage does when it does not Resume (say, a program started again without its resume
	// option). Default false: it refuses to train over them (Join and Checkpoint return an
	// *checkpoint.ExistingCommitsError) until Resume restores one, and deletes
	// nothing; a fresh start would void them and retention delete them. True: NewCoordinator
	// deletes every object of the job in Storage (checkpoint.Committer.PrepareFresh) before it places the slots, so
	// the run starts afresh and the earlier one is lost for good, and Resume then finds no
	// checkpoint. A coordinator that finds its servers running the job (it takes the job over)
	// never deletes, whatever Overwrite says.
	Overwrite bool
	// CommitBacklog is how many snapshots may wait for their commit; a scheduled snapshot that
	// finds no room fails (persisting is that far behind) and training goes on. Default 16.
	CommitBacklog int
	// PersistTimeout bounds the wait for every server's persist of a snapshot. Default 10m.
	PersistTimeout time.Duration
	// JobState, if set, is called at every snapshot (training paused) and its bytes are stored
	// in the commit; Resume returns them. Programs keep their data and model description there.
	JobState func(step uint64) []byte
	// CheckJob, if set, vets the job state of the commit Resume chose before anything is
	// loaded; an error stops the resume (say, the commit belongs to a job of another shape).
	CheckJob func(job []byte) error
	// OnCheckpoint, if set, is called after every snapshot, commit or failure of either, from
	// the coordinator's goroutines one call at a time. It must not block for long.
	OnCheckpoint func(CheckpointEvent)

	// ArriveTimeout bounds the wait at a barrier for a worker inside a batch; one that has not
	// finished it by then is failed (fenced and evicted). Default 30s. It must exceed the
	// longest batch.
	ArriveTimeout time.Duration
	// WorkerSilence fails a worker not heard from for this long (a Session is heard at every
	// batch and every dispatcher call): its epoch is fenced on every server and then its leases
	// go back to the dispatcher. Default: three quarters of the dispatcher's LeaseTTL, so that a
	// silent worker is fenced before its lease could expire and its shard go to another worker
	// with the silent one unfenced. Negative: never (an expired lease is then re-leased without
	// a fence, and only the servers' at-most-once positions keep a late push from landing
	// twice). It must exceed the longest batch and the dispatcher's RetryAfter (how long a
	// worker waiting for shards sleeps between calls), or healthy workers are failed and must
	// join again.
	WorkerSilence time.Duration

	// Recovery is what the job does when a parameter server fails: Rollback (the default) or
	// Partial.
	Recovery RecoveryPolicy
	// HealthEvery is how often the coordinator asks every parameter server for its health.
	// Default 500ms.
	HealthEvery time.Duration
	// ServerTimeout fails a parameter server that has not answered for this long. Default 5s.
	ServerTimeout time.Duration
	// ReplaceWait is how long a failed server's slots wait for a replacement (a new incarnation
	// answering at the same node, or one given to ReplaceServer) before they are restored onto
	// the surviving servers under a new owner table. Default 30s.
	ReplaceWait time.Duration
	// OnRecovery, if set, is called after every recovery from a server failure (or a failed
	// attempt), from the coordinator's goroutine. It must not block for long.
	OnRecovery func(RecoveryEvent)
	// OnProgress, if set, hears of the job's progress: every step trained, checkpoint, move of
	// slots and recovery (ProgressEvent), in order, one call at a time, from a goroutine of the
	// coordinator's own that nothing else waits for: a slow callback delays only later events,
	// and the steps trained meanwhile fold into one event. One callback serves a status page,
	// metrics and a program's own log alike. Coordinator.WaitStep waits for a step without it.
	OnProgress func(ProgressEvent)

	// Scaler, if set, runs the job's processes: SetParallelism hands it the new plan. Nil:
	// the program starts and stops processes itself, and SetParallelism fails.
	Scaler Scaler
	// Secret is the cluster secret (the servers'). The coordinator needs it to reach the
	// servers' RPC port itself: to move slots when the server count changes (SetParallelism,
	// AddServers, RemoveServers, Rebalance) and to read their counters (Usage). Nil: the server
	// count is fixed, and those calls fail.
	Secret []byte
	// Transport dials the servers' RPC ports when slots move. Nil: TCP.
	Transport ps.Transport
	// TLS, when set, is the client side of mutual TLS for those calls (ps.TLS.Client).
	TLS *tls.Config
	// ServerAt, if set, returns how the coordinator reaches a server a scheduler started and
	// told it of through the control protocol (remote.Control.AddServers): say, remote.NewServer
	// with the job's secret. Nil: such calls fail with errors.ErrUnsupported.
	ServerAt func(node ps.Node) (ParameterServer, error)
	// Migration tunes how slots move when the server count changes (concurrency, slots per
	// group, a bandwidth cap); its Secret, Logger and (if nil) Transport are the coordinator's.
	Migration ps.MigratorConfig

	// Logger receives the coordinator's events. Nil discards.
	Logger *slog.Logger
	// Now is the coordinator's one clock: every decision that depends on elapsed time compares
	// its readings: the checkpoint schedule (CheckpointInterval), ArriveTimeout, WorkerSilence,
	// the wait of a worker that joins under a live member's name, a server's health (its last
	// good answer, ServerTimeout, Suspect's folding within HealthEvery), the wait of a recovery
	// for the commits under way (ServerTimeout) and for replacements (ReplaceWait), the wait
	// for a new server to answer, and the times the coordinator reports (Status's Unheard,
	// CheckpointEvent, RecoveryEvent, RepartitionStatus). The dispatcher's clock (lease
	// lifetimes) is Now with the time training was paused at barriers taken out. Loops still
	// tick on real time (HealthEvery and the timers' cadence) to look again, so a test that
	// moves a fake clock sees each decision at the next look; Rebalance measures the servers'
	// load over real time, as their counters run. Nil: time.Now.
	Now func() time.Time
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Job == "" {
		errs = append(errs, errors.New("Job is required"))
	}
	if len(c.Servers) == 0 {
		errs = append(errs, errors.New("no Servers"))
	}
	for i, s := range c.Servers {
		if s == nil {
			errs = append(errs, fmt.Errorf("Servers[%d] is nil", i))
		}
	}
	if c.Slots < 0 {
		errs = append(errs, fmt.Errorf("Slots %d is negative", c.Slots))
	}
	for name, v := range map[string]int{"CheckpointEvery": c.CheckpointEvery, "KeepLast": c.KeepLast, "CommitBacklog": c.CommitBacklog} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s %d is negative", name, v))
		}
	}
	if len(c.Secret) > 0 {
		if err := rpc.ValidateSecret(c.Secret); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Recovery > Partial {
		errs = append(errs, fmt.Errorf("unknown Recovery policy %d", c.Recovery))
	}
	for name, d := range map[string]time.Duration{"CheckpointInterval": c.CheckpointInterval, "PersistTimeout": c.PersistTimeout, "ArriveTimeout": c.ArriveTimeout,
		"HealthEvery": c.HealthEvery, "ServerTimeout": c.ServerTimeout, "ReplaceWait": c.ReplaceWait} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", name, d))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Slots == 0 {
		c.Slots = ps.DefaultSlots
	}
	if c.CommitBacklog == 0 {
		c.CommitBacklog = 16
	}
	if c.PersistTimeout == 0 {
		c.PersistTimeout = 10 * time.Minute
	}
	if c.ArriveTimeout == 0 {
		c.ArriveTimeout = 30 * time.Second
	}
	if c.WorkerSilence == 0 {
		ttl := c.Dispatcher.LeaseTTL
		if ttl <= 0 {
			ttl = 30 * time.Second // shard's default
		}
		c.WorkerSilence = ttl * 3 / 4
	}
	if c.HealthEvery == 0 {
		c.HealthEvery = 500 * time.Millisecond
	}
	if c.ServerTimeout == 0 {
		c.ServerTimeout = 5 * time.Second
	}
	if c.ReplaceWait == 0 {
		c.ReplaceWait = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}
