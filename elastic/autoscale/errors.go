package autoscale

import "errors"

var (
	// ErrInvalidConfig is returned by NewPlanner and Config.Validate for an invalid
	// configuration; the wrapped error lists every problem.
	ErrInvalidConfig = errors.New("autoscale: invalid config")
	// ErrDimension is returned by NNLS and Fit for input of inconsistent or empty size.
	ErrDimension = errors.New("autoscale: inconsistent dimensions")
	// ErrNotConverged is returned by NNLS when the active-set iteration reaches its limit.
	ErrNotConverged = errors.New("autoscale: least squares did not converge")
	// ErrNoModel is returned by Fit when the samples determine no model (none usable, or every
	// coefficient fits to zero) and by Planner.Model before any sample.
	ErrNoModel = errors.New("autoscale: no model fits the samples")
	// ErrInvalidSample is returned by Fit for a sample with a non-positive or non-finite count,
	// size or throughput.
	ErrInvalidSample = errors.New("autoscale: invalid sample")
	// ErrInvalidProfile is returned by Planner.Begin for a job profile with a non-positive
	// size.
	ErrInvalidProfile = errors.New("autoscale: invalid job profile")
	// ErrNoRestarter is the error of a RestartServer decision when RunnerConfig.RestartServer
	// is nil: the runner cannot restart a server.
	ErrNoRestarter = errors.New("autoscale: no way to restart a server (RunnerConfig.RestartServer)")
	// ErrNoReplacer is the error of a ReplaceWorker decision when RunnerConfig.ReplaceWorker is
	// nil and the Job has no Fail method: the runner cannot replace a worker.
	ErrNoReplacer = errors.New("autoscale: no way to replace a worker (RunnerConfig.ReplaceWorker)")
)
