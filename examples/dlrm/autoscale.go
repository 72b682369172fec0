package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
	"github.com/elasticps/elasticps/elastic/kube"
	"github.com/elasticps/elasticps/examples/dlrm/train"
)

// kubeAutoscale is the autoscaler of a -kube coordinator run with -autoscale: an
// autoscale.Runner on the job's coordinator, fed the scaler's signals (kube.Scaler is an
// autoscale.Signals). A nil *kubeAutoscale is the coordinator without one: its methods then do
// what the coordinator does without.
type kubeAutoscale struct {
	o       *options
	log     *slog.Logger
	emit    func(train.Event)
	planner *autoscale.Planner

	mu     sync.Mutex // serializes the notes
	wg     sync.WaitGroup
	cancel context.CancelFunc
}

// newKubeAutoscale returns the autoscaler -autoscale asks for, nil without it, or why its
// planner cannot be made (before the job starts, so that a job asked to autoscale never runs
// without).
func newKubeAutoscale(o *options, rc train.RoleConfig) (*kubeAutoscale, error) {
	if !o.autoscale {
		return nil, nil
	}
	planner, err := autoscale.NewPlanner(autoscale.Config{MaxWorkers: o.workers,
		MinServers: o.cfg.Servers, MaxServers: o.cfg.Servers, PendingFor: o.pendingFor, NearMemory: o.nearMemory, Logger: rc.Logger})
	if err != nil {
		return nil, fmt.Errorf("-autoscale: %w", err)
	}
	return &kubeAutoscale{o: o, log: rc.Logger, emit: rc.OnEvent, planner: planner, cancel: func() {}}, nil
}

// pendingTimeout is the scaler's Config.PendingTimeout: with the autoscaler, well above its
// PendingFor and period, so that it answers a pending pod before the scaler fails its start.
func (a *kubeAutoscale) pendingTimeout() time.Duration {
	if a == nil {
		return 0 // the scaler's default
	}
	return max(kube.DefaultPendingTimeout, 2*a.o.pendingFor+3*a.o.autoscaleEvery)
}

// podEvent tells of the scaler's events the autoscaler answers.
func (a *kubeAutoscale) podEvent(ev kube.Event) {
	if a == nil {
		return
	}
	switch ev.Kind {
	case kube.EventUnschedulable, kube.EventPending, kube.EventOOMKilled:
		a.note("pods: %s", ev)
	}
}

func (a *kubeAutoscale) note(format string, args ...any) {
	if a.emit == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.emit(train.Event{Kind: train.EventNote, Message: "autoscale: " + fmt.Sprintf(format, args...)})
}

// scale starts the job's pods for plan. Without the autoscaler, it waits for them all. With it,
// it waits for the servers, which the coordinator needs, and starts the workers in the
// background, one at a time in order: a worker no node can hold then waits for the
// autoscaler rather than failing the job's start, and it is the highest-numbered, which a plan
// of fewer workers gives up (the workers started after it wait for its answer). The background
// start stops once the plan's workers are not those it set (the autoscaler changed them).
func (a *kubeAutoscale) scale(ctx context.Context, scaler *kube.Scaler, plan elastic.Plan) error {
	if a == nil {
		return scaler.Scale(ctx, plan)
	}
	servers := plan
	servers.Workers = 0
	if err := scaler.Scale(ctx, servers); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	a.cancel = cancel
	a.wg.Go(func() {
		for k := 1; k <= plan.Workers; k++ {
			p := scaler.Plan() // the sizes as the autoscaler may have changed them
			if p.Workers != k-1 {
				return
			}
			p.Workers = k
			if err := scaler.Scale(ctx, p); err != nil {
				if ctx.Err() == nil {
					a.note("the start of worker %d: %v", k-1, err)
				}
				return
			}
		}
	})
	return nil
}

// start runs the autoscaler on the job's coordinator until stop: the counts within -ps
// servers and -workers workers. Once the coordinator is closed its SetPlan fails with
// elastic.ErrClosed, so a decision taken after the job's end changes nothing.
func (a *kubeAutoscale) start(ctx context.Context, coord *elastic.Coordinator, scaler *kube.Scaler) {
	if a == nil {
		return
	}
	r, err := autoscale.NewRunner(autoscale.RunnerConfig{Job: coord, Planner: a.planner, Signals: scaler,
		Every: a.o.autoscaleEvery, Logger: a.log,
		OnApplied: func(ap autoscale.Applied) {
			if ap.Err != nil {
				a.note("%s %s failed: %v (%s)", ap.Decision.Kind, ap.Decision.Target, ap.Err, ap.Decision.Reason)
				return
			}
			a.note("%s %s: %s", ap.Decision.Kind, ap.Decision.Target, ap.Decision.Reason)
		}})
	if err != nil {
		panic(fmt.Sprintf("autoscale: a Runner of a coordinator and a planner: %v", err)) // both are set: cannot fail
	}
	ctx, cancel := context.WithCancel(ctx)
	prev := a.cancel
	a.cancel = func() { prev(); cancel() }
	a.wg.Go(func() { _ = r.Run(ctx) })
	a.note("observing the job every %v; a pod pending for %v is asked for smaller or given up", a.o.autoscaleEvery, a.o.pendingFor)
}

// stop ends the autoscaler and the workers' start, and waits for them.
func (a *kubeAutoscale) stop() {
	if a == nil {
		return
	}
	a.cancel()
	a.wg.Wait()
}
