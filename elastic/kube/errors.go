package kube

import "errors"

var (
	// ErrPending is returned (wrapped, with the scheduler's message) by Scale and StartServers
	// for a pod that stayed unscheduled longer than Config.PendingTimeout; the pod is deleted.
	// It is also a node id's PodStatus.Err when a replacement pod stayed unscheduled.
	ErrPending = errors.New("kube: the pod stayed unscheduled")
	// ErrRestartLimit is a node id's PodStatus.Err once its pods ended abnormally more often
	// than Config.MaxRestarts allows; the error also names the last end.
	ErrRestartLimit = errors.New("kube: the pod ended abnormally more often than the restart limit allows")
	// ErrStopped is a node id's PodStatus.Err once Scale, StopServers or Close deleted its pod.
	ErrStopped = errors.New("kube: the pod was deleted by its scaler")
	// ErrConflict is returned by New, and by the start of a pod, when an object of the name the
	// scaler would use (the job's Service, a node id's pod) exists and does not carry the job's
	// labels: it belongs to something else, and the scaler leaves it alone.
	ErrConflict = errors.New("kube: an object of that name belongs to something else")
	// ErrLeaseLost is returned by Lead when another candidate took the lease while run ran.
	ErrLeaseLost = errors.New("kube: leadership lost: another candidate holds the lease")
)
