package metrics

import (
	"errors"
	"fmt"
	"github.com/elasticps/elasticps/elastic"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Step is one training step of a worker, as the worker timed it.
type Step struct {
	// Pull is the time spent pulling rows from the parameter servers, Compute the forward and
	// backward passes, Push the time spent pushing gradients.
	Pull, Compute, Push time.Duration
	// Samples is the number of samples (records) the step trained.
	Samples int
	// Loss is the step's loss.
	Loss float64
}

// Phases of a step, the values of the label phase.
const (
	PhasePull    = "pull"
	PhaseCompute = "compute"
	PhasePush    = "push"
)

// Worker is a worker's metrics, fed by ObserveStep:
//
//	elasticps_worker_step_duration_seconds{phase}  histogram  time of each phase of a step (pull, compute, push)
//	elasticps_worker_samples_total                 counter    samples trained
//	elasticps_worker_loss                          gauge      the newest step's loss (absent before the first step)
//
// The number of steps is the histogram's count (any phase); samples per second is
// rate(elasticps_worker_samples_total[...]). A Worker is a prometheus.Collector, safe for
// concurrent use; register it with the process's Registerer.
type Worker struct {
	phase   *prometheus.HistogramVec
	pull    prometheus.Observer
	compute prometheus.Observer
	push    prometheus.Observer
	samples prometheus.Counter
	loss    *prometheus.Desc

	mu      sync.Mutex
	last    float64
	hasLoss bool
}

var _ prometheus.Collector = (*Worker)(nil)

// stepBuckets are the upper bounds, in seconds, of a worker's step-phase histogram: 0.25 ms to
// about 8 s, doubling.
func stepBuckets() []float64 { return prometheus.ExponentialBuckets(0.00025, 2, 16) }

// NewWorker returns a worker's metrics; cfg.Node (the worker's id) is required, cfg.Role
// defaults to "worker".
func NewWorker(cfg Config) (*Worker, error) {
	cfg = cfg.withDefaults(elastic.RoleWorker.String(), "")
	err := cfg.Validate()
	if cfg.Node == "" {
		err = errors.Join(err, fmt.Errorf("%w: Node is required for a worker", ErrInvalidConfig))
	}
	if err != nil {
		return nil, err
	}
	w := &Worker{
		phase: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: "worker", Name: "step_duration_seconds",
			Help:        "Time of each phase of a training step: pull (rows from the parameter servers), compute (forward and backward passes), push (gradients to the servers).",
			ConstLabels: cfg.labels(), Buckets: stepBuckets(),
		}, []string{"phase"}),
		samples: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "worker", Name: "samples_total",
			Help: "Samples (records) trained.", ConstLabels: cfg.labels(),
		}),
		loss: cfg.desc("worker_loss", "Loss of the newest training step."),
	}
	w.pull, w.compute, w.push = w.phase.WithLabelValues(PhasePull), w.phase.WithLabelValues(PhaseCompute), w.phase.WithLabelValues(PhasePush)
	return w, nil
}

// ObserveStep records one training step. Negative durations and samples count as zero.
func (w *Worker) ObserveStep(s Step) {
	w.pull.Observe(seconds(s.Pull))
	w.compute.Observe(seconds(s.Compute))
	w.push.Observe(seconds(s.Push))
	w.samples.Add(float64(max(s.Samples, 0)))
	w.mu.Lock()
	w.last, w.hasLoss = s.Loss, true
	w.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (w *Worker) Describe(ch chan<- *prometheus.Desc) {
	w.phase.Describe(ch)
	w.samples.Describe(ch)
	ch <- w.loss
}

// Collect implements prometheus.Collector.
func (w *Worker) Collect(ch chan<- prometheus.Metric) {
	w.phase.Collect(ch)
	w.samples.Collect(ch)
	w.mu.Lock()
	loss, ok := w.last, w.hasLoss
	w.mu.Unlock()
	if ok {
		ch <- prometheus.MustNewConstMetric(w.loss, prometheus.GaugeValue, loss)
	}
}

// seconds returns d in seconds, for a histogram's observation.
func seconds(d time.Duration) float64 { return math.Max(d.Seconds(), 0) }
