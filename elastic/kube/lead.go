package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/elasticps/elasticps/elastic"
)

// LeaderConfig configures Lead. The zero value of every field but Client, Namespace, Name and
// Identity means its default.
type LeaderConfig struct {
	// Client reaches the apiserver. Required: it needs get, create and update on
	// coordination.k8s.io leases in Namespace.
	Client kubernetes.Interface
	// Namespace and Name name the Lease, one per job (the job's name, say). Required.
	Namespace, Name string
	// Identity names this candidate: unique among them (the pod's name, say). Required.
	Identity string
	// LeaseDuration is how long the candidates wait, after the last renewal they saw, before
	// one takes the lease over: the time a job goes without a coordinator when the leader dies
	// without releasing it. Default 15s.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader tries to renew before it gives up leading. It must
	// be below LeaseDuration: a leader that could not renew stops before another may take over.
	// Default 10s.
	RenewDeadline time.Duration
	// RetryPeriod is the pause between tries to acquire or renew. Default 2s.
	RetryPeriod time.Duration
	// Logger receives the election's events. Nil discards.
	Logger *slog.Logger
}

// Validate reports every problem of c, with its defaults, at once (an error wrapping
// elastic.ErrInvalidConfig).
func (c LeaderConfig) Validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("Client is required"))
	}
	if c.Namespace == "" || c.Name == "" {
		errs = append(errs, errors.New("Namespace and Name are required"))
	}
	if c.Identity == "" {
		errs = append(errs, errors.New("Identity is required"))
	}
	if c.LeaseDuration < 0 || c.RenewDeadline < 0 || c.RetryPeriod < 0 {
		errs = append(errs, fmt.Errorf("negative durations: LeaseDuration %v, RenewDeadline %v, RetryPeriod %v", c.LeaseDuration, c.RenewDeadline, c.RetryPeriod))
	} else if d := c.withDefaults(); d.LeaseDuration <= d.RenewDeadline || float64(d.RenewDeadline) <= leaderelection.JitterFactor*float64(d.RetryPeriod) {
		errs = append(errs, fmt.Errorf("want LeaseDuration (%v) > RenewDeadline (%v) > %g × RetryPeriod (%v)", d.LeaseDuration, d.RenewDeadline, leaderelection.JitterFactor, d.RetryPeriod))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", elastic.ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

func (c LeaderConfig) withDefaults() LeaderConfig {
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 15 * time.Second
	}
	if c.RenewDeadline == 0 {
		c.RenewDeadline = 10 * time.Second
	}
	if c.RetryPeriod == 0 {
		c.RetryPeriod = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Lead runs run while this candidate holds the job's Lease (coordination.k8s.io), so that one
// coordinator at a time runs the job: it waits until it acquires the lease, renews it while run
// runs, and cancels run's ctx when ctx ends or it loses the lease (it could not renew within
// RenewDeadline, another candidate took it over). Lead returns once run has returned: nil when
// run returned by itself (the job is done) or ctx ended, the lease then released for the next
// candidate to take without waiting LeaseDuration; ErrLeaseLost when the lease was lost, which
// is then left to expire. After ctx ends the lease is still renewed until run has returned, so
// that two leaders never act at once however long run takes to stop: run should stop acting
// for the job as soon as its ctx ends. A process killed meanwhile leaves the lease to expire.
func Lead(ctx context.Context, cfg LeaderConfig, run func(ctx context.Context)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger.With("lease", cfg.Namespace+"/"+cfg.Name, "identity", cfg.Identity)
	ran := make(chan struct{})
	// The elector runs until run has returned, ctx ended or not, and then releases the lease;
	// before the lease is held, ctx's end stops it.
	electCtx, stopElecting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElecting()
	lock := &heldLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
		Client:     cfg.Client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
	}, stopping: electCtx.Done(), ran: ran, log: log}
	var finished atomic.Bool // run returned by itself while the lease was held
	defer context.AfterFunc(ctx, func() {
		if !lock.held.Load() {
			stopElecting()
		}
	})()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            cfg.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				defer close(ran)
				log.Info("leading")
				runCtx, cancel := context.WithCancel(leading)
				stop := context.AfterFunc(ctx, cancel)
				run(runCtx)
				stop()
				cancel()
				finished.Store(leading.Err() == nil && ctx.Err() == nil)
				stopElecting()
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return fmt.Errorf("%w: %w", elastic.ErrInvalidConfig, err)
	}
	le.Run(klog.NewContext(electCtx, logr.FromSlogHandler(log.Handler())))
	if !lock.held.Load() {
		return nil // ctx ended before the lease was ours
	}
	<-ran // the elector runs run in a goroutine of its own, and does not wait for it
	if finished.Load() {
		log.Info("done leading: released the lease")
		return nil
	}
	if ctx.Err() != nil {
		log.Info("stopped leading: released the lease")
		return nil
	}
	log.Warn("lost the lease")
	return ErrLeaseLost
}

// heldLock is a lock that notes whether it was ever written as this candidate's: then the
// elector acquired it and has started OnStartedLeading.
//
// It also makes the release safe: the elector releases the lease as soon as its context ends
// or a renewal fails, while run may still be acting for the job, and the next candidate must
// not lead before run has stopped. A release asked for because Lead stops (stopping is closed)
// waits until run has returned; one after a failed renewal, run still running, is refused, and
// the lease expires by itself, which gives run LeaseDuration - RenewDeadline to stop.
type heldLock struct {
	resourcelock.Interface
	stopping <-chan struct{} // closed when Lead stops electing: run returned, or Lead's ctx ended
	ran      <-chan struct{} // closed once run has returned
	log      *slog.Logger
	held     atomic.Bool
}

// errLeftToExpire refuses a release while run may still act for the job.
var errLeftToExpire = errors.New("kube: the lease is left to expire: the leader may still be acting")

func (l *heldLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, r)
	l.note(err, r)
	return err
}

func (l *heldLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	release := r.HolderIdentity == "" && l.held.Load()
	if release {
		select {
		case <-l.stopping:
		default:
			return errLeftToExpire
		}
		// The elector gives the release RenewDeadline: a run slower to stop than that keeps
		// the lease until it expires, rather than share the job with the next leader.
		select {
		case <-l.ran:
		case <-ctx.Done():
			l.log.Warn("the leader did not stop in time: the lease is left to expire", "err", ctx.Err())
			return ctx.Err()
		}
	}
	err := l.Interface.Update(ctx, r)
	l.note(err, r)
	if release && err == nil {
		l.log.Info("released the lease")
	}
	return err
}

func (l *heldLock) note(err error, r resourcelock.LeaderElectionRecord) {
	if err == nil && r.HolderIdentity == l.Identity() {
		l.held.Store(true)
	}
}
