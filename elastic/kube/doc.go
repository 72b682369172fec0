// Package kube runs an elastic job's parameter servers and workers as Kubernetes pods, through
// client-go: Scaler is an elastic.ServerScaler, and Lead elects one coordinator per job with a
// Lease. Only programs that import this package link client-go; the rest of the library does not
// know Kubernetes.
//
// # Pods and the Service
//
// Every node id runs in a pod of its own, made from Config.Template (the user's image, command,
// default resources, node selector, tolerations, priority class, service account, labels and
// annotations are kept) and named after the job and the node id:
//
//	pod            <job>-ps-0, <job>-worker-3 (PodName); hostname = the pod's name, subdomain = <job>
//	Service        <job>: headless (clusterIP None), selects every pod of the job, publishes
//	               not-ready addresses, port "ps" = Config.Port (7070)
//	server address <job>-ps-<i>.<job>.<namespace>.svc.<domain>:<port> (ServerAddr), resolvable
//	               as soon as the pod has an IP
//	labels         elasticps.io/job, elasticps.io/role (ps|worker), elasticps.io/node (the node
//	               id), app.kubernetes.io/{name=elasticps, instance=<job>, component=<role>,
//	               managed-by=elasticps}
//	annotation     elasticps.io/restart: the incarnation (Launch.Restart)
//	restartPolicy  Never: the scaler replaces a pod itself, so a replacement may get another size
//	resources      the plan's size for the role as requests = limits (CPU in millicores, memory
//	               in bytes), else the template's
//	env            ELASTICPS_SECRET from Config.Secret (secretKeyRef: the cluster secret is never
//	               on a command line or in the pod spec), ELASTICPS_JOB, ELASTICPS_ROLE,
//	               ELASTICPS_NODE_ID, ELASTICPS_RESTART, ELASTICPS_ADDR (servers), POD_NAME,
//	               POD_NAMESPACE, POD_IP (downward API), GOMAXPROCS and GOMEMLIMIT from the
//	               container's limits (unless the template sets them), then Config.Env's
//	args           the template's, then Config.Args's for the start (role, node id, addresses)
//	owner          Config.Owner on every pod and the Service: deleting it deletes them all
//
// The scaler watches the job's pods with an informer (label selector elasticps.io/job=<job>)
// and never polls. A pod already there under a name it would create (an earlier coordinator's,
// whose process died, or one that handed the job over with Leave) is adopted if it runs, and
// deleted first if it ended. Close, at the job's end, deletes every pod of the job, adopted or
// not; Leave deletes none.
//
// # Scaling
//
// Scaler obeys the contract written on elastic.Scaler (elastictest.TestScaler checks it, with a
// kubelet stand-in). The first Scale creates the plan's server pods; every Scale creates the
// missing workers and deletes the highest-numbered ones beyond the plan. A deletion has the grace
// period Config.StopGrace, and is a worker's drain: its program gets SIGTERM, finishes its batch
// and leaves, and Scale returns once the pod is gone. StartServers and StopServers change the
// server count, the highest-numbered first, for the coordinator's live repartition. Calls return
// once the pods they created run (their container) and the pods they deleted are gone.
//
// # Events and failures
//
// Each node id has a goroutine that follows its newest pod and reports what happens to it
// (Config.OnEvent, Event):
//
//	Pending    unscheduled longer than PendingTimeout: the scheduler's message ("0/3 nodes are
//	           available: 3 Insufficient memory."); the pod is deleted, and the start that
//	           waits for it fails with ErrPending
//	Running    the container runs
//	Exited     the container exited by itself (ExitCode; 0 is a worker done with its data)
//	OOMKilled  over its memory limit (MemoryLimit is the limit it went over)
//	Evicted    status reason Evicted, or a DisruptionTarget condition (eviction API, taint)
//	Preempted  a DisruptionTarget condition of reason PreemptionByScheduler
//	Deleted    deleted behind the scaler's back
//	Stopped    deleted by the scaler (Scale, StopServers, Close)
//	Refused    the apiserver refused to create it (an exceeded quota, say); the start fails
//	Unschedulable  the scheduler found no node for the pod yet (its message), once per pod;
//	           the pod waits (see Signals below)
//
// A pod that ends by itself is reported at once to the Reporter (SetReporter; a
// *elastic.Coordinator is one): every end of a server (ServerFailed), an abnormal end of a worker
// (Fail). After an abnormal end, and up to Config.MaxRestarts per node id, the ended pod is
// deleted and a replacement created under the same name as the next incarnation; after an OOM
// kill its memory limit and request are the old limit times Config.OOMGrowth (capped at
// MaxMemory). A worker that exits with status 0 is done. A node id at its restart limit keeps
// its ended pod (for its logs) until it is stopped, and PodStatus.Err wraps ErrRestartLimit.
//
// # Signals for an autoscaler
//
// Deciding what to do about these events (more memory for a server killed for lack of it, a
// smaller request for a pod no node can hold, fewer workers) is an autoscaler's job: a Scaler is
// an autoscale.Signals, which autoscale.RunnerConfig.Signals hands to an autoscale.Runner:
//
//	Pending        the plan's pods not placed yet, with the size asked, the wait at that size and
//	               the scheduler's message
//	OOMKills       the servers killed for going over their limit since the previous call
//	RestartServer  a server's pod restarted at the plan's server size, unless it has it already
//	Plan           the plan, which the Runner reads while the coordinator has none
//
// A Scale whose plan changes a role's size asks again, at the new size, for the pods of the
// role that are still pending (a ShrinkRequest carried out), while the pods that run keep
// theirs. An OOM kill is answered twice over, once by each layer, and the two agree: the scaler
// replaces the pod at once with OOMGrowth times the limit, so the server is back as soon as
// possible, and the autoscaler's answer (autoscale.Config.MemoryGrowth times the limit, the plan's
// server size from then on) finds the replacement that large already, so its RestartServer does
// nothing and the server restores its slots once, from the replacement. PendingTimeout is then
// the last resort: set it well above autoscale.Config.PendingFor and the Runner's period, so the
// autoscaler shrinks or gives up a pending pod before its start fails.
//
// # Leadership
//
// Lead runs a function while the caller holds the job's coordination.k8s.io Lease, cancels its
// context when the lease is lost, and releases the lease when its own context ends, once the
// function has returned (never while it may still act for the job), so that another replica of
// the coordinator takes the job over at once (elastic.Coordinator.Resume). A lease lost is not
// released: it expires.
//
// # RBAC
//
// The coordinator's service account needs, in the job's namespace (examples/k8s/rbac.yaml):
//
//	pods                          get, list, watch, create, delete
//	services                      get, create
//	coordination.k8s.io leases    get, create, update (Lead)
//
// The servers and workers need none. A refused call is returned with the apiserver's error
// (apierrors.IsForbidden sees it): New checks list on pods at once. On a cluster whose
// OwnerReferencesPermissionEnforcement admission plugin is on, an Owner with BlockOwnerDeletion
// also needs update on the owner's finalizers.
//
// # Concurrency
//
// A Scaler is safe for concurrent use; StartServers and StopServers run one at a time. Config's
// Args, Env and OnEvent and the Reporter are called from the goroutine of the node id they are
// about: calls about different node ids may come concurrently, and one node id's come in order.
// Config.Server is called by StartServers. Close is idempotent, deletes the pods and joins every goroutine, the
// informer's too.
package kube
