package elastic

import "errors"

var (
	// ErrInvalidConfig is returned by constructors and Validate for an invalid configuration;
	// the wrapped error lists every problem.
	ErrInvalidConfig = errors.New("elastic: invalid config")
	// ErrClosed is returned by calls on a closed Coordinator or Session.
	ErrClosed = errors.New("elastic: closed")
	// ErrNotMember is returned by Coordinator.Begin when the worker is not a member under the
	// epoch it gave: it was failed or replaced, its epoch is fenced, and it must Join again.
	ErrNotMember = errors.New("elastic: not a member (join again)")
	// ErrStopped is returned by Coordinator.Begin and Session.Step once training has stopped.
	ErrStopped = errors.New("elastic: training stopped")
	// ErrNotFresh is returned by a server's Load when it holds rows changed by updates: a
	// restore would mix the checkpoint with later training. Restart the job's processes.
	ErrNotFresh = errors.New("elastic: a checkpoint is restored only into a parameter server that has applied no update since it started; restart every process of the job to resume")
	// ErrReplaced is a server's refusal of a call meant for an earlier incarnation of it: its
	// process restarted, and it waits to be restored (ParameterServer.Admit).
	ErrReplaced = errors.New("elastic: the parameter server restarted since (a new incarnation)")
	// ErrCommitsBehind is the failure of a snapshot not taken because Config.CommitBacklog
	// snapshots already wait for their commit (persisting is that far behind); training goes on
	// and the next checkpoint is due an interval later.
	ErrCommitsBehind = errors.New("elastic: too many snapshots wait for their commit")
	// ErrNeedsResume is returned by Coordinator.Join when the coordinator found its servers
	// running a job (a coordinator restarted while they trained): Resume takes the job over first.
	ErrNeedsResume = errors.New("elastic: the parameter servers are running a job: call Resume to take it over first")
	// ErrSuperseded is a parameter server's refusal of a coordinator that another one, of a
	// later incarnation, has taken over from (ParameterServer.Lead); the job is that one's now.
	ErrSuperseded = errors.New("elastic: another coordinator has taken over the job")
	// ErrDuplicateWorker is returned by Coordinator.Join when another process trains under
	// the worker's name: the one that joined first was heard from while the newcomer waited for
	// it to end. Give every worker process its own name.
	ErrDuplicateWorker = errors.New("elastic: another live worker has this name")
	// ErrUnavailable wraps a remote call that did not reach the other process (not up yet, or
	// gone); it was certainly not processed.
	ErrUnavailable = errors.New("elastic: unavailable")
)
