package kube

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/elasticps/elasticps/elastic"
)

// MaxJobLen is the longest job name: a pod's name ("<job>-worker-12345678") is also its
// hostname, a DNS label of at most 63 characters.
const MaxJobLen = 47

// Defaults of Config.
const (
	DefaultPort           int32 = 7070
	DefaultPendingTimeout       = 2 * time.Minute
	DefaultStopGrace            = 30 * time.Second
	DefaultOOMGrowth            = 1.5
	DefaultClusterDomain        = "cluster.local"
)

// Launch is one start of a pod of a Scaler: what Config.Args and Config.Env are given.
type Launch struct {
	// Role is the pod's role: elastic.RoleServer or elastic.RoleWorker.
	Role elastic.Role
	// ID is its node id, elastic.ServerID(i) or elastic.WorkerID(i).
	ID string
	// Restart is 0 at the node id's first pod and n at its n-th replacement after a pod ended
	// abnormally: the incarnation.
	Restart int
	// Size is the pod's size: the plan's for its role when the node id was started, with the
	// memory grown after an OOM kill. Zero fields: the template's.
	Size elastic.Resources
	// Addr is a server's address, its DNS name in the job's Service with the port
	// (ServerAddr); "" for a worker.
	Addr string
}

// Reporter is told at once when a pod ends by itself (a crash, an OOM kill, an eviction, a
// deletion behind the scaler's back): *elastic.Coordinator satisfies it. A server's every end is
// reported; a worker's only an abnormal one (a worker whose data is done exits with status 0 and
// leaves on its own). reason says what happened ("pod j-ps-0 OOMKilled: exit code 137, memory
// limit 64Mi"). The calls come from the goroutine of the pod's node id and must not block for long.
type Reporter interface {
	ServerFailed(id, reason string)
	Fail(worker, reason string)
}

// Config configures a Scaler. The zero value of every field but Client, Namespace, Job,
// Template, Args and Secret means its default. Args, Env and OnEvent are called from the
// goroutine of the node id they are about: calls about different node ids may come
// concurrently, and one node id's come in order. Server is called by StartServers.
type Config struct {
	// Client reaches the apiserver. Required. Its rights: see the package doc (RBAC).
	Client kubernetes.Interface
	// Namespace holds the job's pods and Service. Required.
	Namespace string
	// Job names the job: a DNS-1035 label (lower-case letters, digits and '-', starting with a
	// letter) of at most MaxJobLen characters. Pods are "<job>-ps-<i>" and "<job>-worker-<i>",
	// and the headless Service is "<job>". Required.
	Job string

	// Template is the pod every node id runs: image, command, default resources, node
	// selector, tolerations, priority class, service account, labels and annotations are kept.
	// The scaler sets the name, hostname, subdomain, restart policy (Never: the scaler replaces
	// pods itself, so that a replacement may get another size), grace period, owner, its labels
	// and annotation, the environment it names in the package doc and, when the plan sizes the
	// role, the resources. Required: at least one container.
	Template corev1.PodTemplateSpec
	// Container names the template's container that runs the elasticps program. Default: the
	// template's one container (a template with several must name it).
	Container string
	// Args returns the arguments a start appends to the container's args: the role, node id,
	// listen address (Launch.Addr's port), the coordinator's address, whatever the program's
	// flags are. Called once per pod. Required.
	Args func(l Launch) []string
	// Env, if set, returns environment variables a pod gets on top of the template's and the
	// scaler's (a name given twice: the last wins). Called once per pod.
	Env func(l Launch) []corev1.EnvVar
	// Port is the servers' RPC port: a named container port "ps" and the Service's port.
	// Default DefaultPort.
	Port int32
	// Secret selects the cluster secret: every pod gets it as ELASTICPS_SECRET from the Secret
	// (valueFrom.secretKeyRef), never on a command line. Name and Key are required.
	Secret corev1.SecretKeySelector
	// Owner, if set, is put on every pod and the Service, so that deleting the owner (the
	// coordinator's Job, say) deletes them all (the garbage collector). Nil: none.
	Owner *metav1.OwnerReference

	// Server, if set, returns how the coordinator reaches the server at addr (say
	// remote.NewServer with the job's secret), which makes StartServers start server pods.
	// Nil: StartServers fails with errors.ErrUnsupported.
	Server func(id, addr string) (elastic.ParameterServer, error)
	// MaxRestarts is how many times a node id whose pod ended abnormally gets a replacement pod,
	// over the node id's life. A pod that exits with status 0 is done, and one the scaler
	// deleted is never replaced. Default 0: never.
	MaxRestarts int
	// PendingTimeout is how long a pod may stay unscheduled: then its start fails with an error
	// wrapping ErrPending and the scheduler's message, an EventPending is emitted and the pod is
	// deleted. Default DefaultPendingTimeout.
	PendingTimeout time.Duration
	// StopGrace is the grace period of a pod the scaler deletes (its
	// terminationGracePeriodSeconds too): the program gets SIGTERM, then SIGKILL after it. A
	// worker drains in it (it finishes its batch and leaves). Whole seconds, rounded up.
	// Default DefaultStopGrace.
	StopGrace time.Duration
	// OOMGrowth multiplies the memory limit (and request) of a pod replaced after an OOM kill:
	// at least 1, the memory rounded up to a whole MiB. Default DefaultOOMGrowth.
	OOMGrowth float64
	// MaxMemory caps the memory OOMGrowth gives, in bytes. Default 0: no cap.
	MaxMemory int64
	// ClusterDomain is the cluster's DNS domain, for ServerAddr. Default DefaultClusterDomain.
	ClusterDomain string

	// OnEvent, if set, is called at every change of a pod that matters (see Event). It must not
	// block for long.
	OnEvent func(Event)
	// Logger receives the scaler's events. Nil discards.
	Logger *slog.Logger
}

// Validate reports every problem of c at once (an error wrapping elastic.ErrInvalidConfig).
func (c Config) Validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("Client is required"))
	}
	if c.Namespace == "" {
		errs = append(errs, errors.New("Namespace is required"))
	}
	switch {
	case c.Job == "":
		errs = append(errs, errors.New("Job is required"))
	case len(c.Job) > MaxJobLen:
		errs = append(errs, fmt.Errorf("Job %q is longer than %d characters", c.Job, MaxJobLen))
	default:
		for _, msg := range validation.IsDNS1035Label(c.Job) {
			errs = append(errs, fmt.Errorf("Job %q: %s", c.Job, msg))
		}
	}
	if _, err := c.container(); err != nil {
		errs = append(errs, err)
	}
	if c.Args == nil {
		errs = append(errs, errors.New("Args is required"))
	}
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("Port %d is out of range", c.Port))
	}
	if c.Secret.Name == "" || c.Secret.Key == "" {
		errs = append(errs, errors.New("Secret needs a Name and a Key"))
	}
	if c.MaxRestarts < 0 {
		errs = append(errs, fmt.Errorf("MaxRestarts %d is negative", c.MaxRestarts))
	}
	if c.PendingTimeout < 0 {
		errs = append(errs, fmt.Errorf("PendingTimeout %v is negative", c.PendingTimeout))
	}
	if c.StopGrace < 0 {
		errs = append(errs, fmt.Errorf("StopGrace %v is negative", c.StopGrace))
	}
	if c.OOMGrowth != 0 && c.OOMGrowth < 1 {
		errs = append(errs, fmt.Errorf("OOMGrowth %g is below 1", c.OOMGrowth))
	}
	if c.MaxMemory < 0 {
		errs = append(errs, fmt.Errorf("MaxMemory %d is negative", c.MaxMemory))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", elastic.ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// container returns the index of the template's container that runs the program.
func (c Config) container() (int, error) {
	cs := c.Template.Spec.Containers
	if c.Container == "" {
		if len(cs) != 1 {
			return 0, fmt.Errorf("Template has %d containers: name the program's (Container)", len(cs))
		}
		return 0, nil
	}
	for i := range cs {
		if cs[i].Name == c.Container {
			return i, nil
		}
	}
	return 0, fmt.Errorf("Template has no container %q", c.Container)
}

func (c Config) withDefaults() Config {
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.PendingTimeout == 0 {
		c.PendingTimeout = DefaultPendingTimeout
	}
	if c.StopGrace == 0 {
		c.StopGrace = DefaultStopGrace
	}
	if c.OOMGrowth == 0 {
		c.OOMGrowth = DefaultOOMGrowth
	}
	if c.ClusterDomain == "" {
		c.ClusterDomain = DefaultClusterDomain
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
