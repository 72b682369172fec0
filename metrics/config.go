package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Config names the process whose series a collector makes: every series carries its Job, Role
// and Node as constant labels, so that series of many jobs and processes can share one
// Prometheus (and one registry, when several roles run in one process).
type Config struct {
	// Job is the training job's name, the label training_job of every series. (The label is
	// not called job: Prometheus gives every scraped series the scrape configuration's job
	// label, and would rename an exposed one to exported_job.) Required.
	Job string
	// Role is the label role: default "ps" for NewServer, "coordinator" for NewCoordinator
	// and "worker" for NewWorker; RegisterProcess leaves the label out when it is empty.
	Role string
	// Node is the label node, the process's node id: default the server's ID for NewServer and
	// "coordinator" for NewCoordinator; required for NewWorker (its worker id, say worker-0),
	// since workers sharing a registry must differ; RegisterProcess leaves the label out when
	// it is empty. (The label is not called instance, another label Prometheus gives every
	// scraped series.)
	Node string
	// HotSlots is how many of a server's slots NewServer reports one by one: the busiest since
	// the previous scrape, by rows served. Default 8; negative: none. Each costs three series.
	HotSlots int
}

// Label names of Config's constant labels.
const (
	LabelJob  = "training_job"
	LabelRole = "role"
	LabelNode = "node"
)

// Namespace prefixes every series this package makes (Go and process series aside).
const Namespace = "elasticps"

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if c.Job == "" {
		errs = append(errs, errors.New("Job is required"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// labels are c's constant labels, those with a value.
func (c Config) labels() prometheus.Labels {
	l := prometheus.Labels{LabelJob: c.Job}
	if c.Role != "" {
		l[LabelRole] = c.Role
	}
	if c.Node != "" {
		l[LabelNode] = c.Node
	}
	return l
}

// desc makes the description of series elasticps_<name> with c's constant labels.
func (c Config) desc(name, help string, variable ...string) *prometheus.Desc {
	return prometheus.NewDesc(Namespace+"_"+name, help, variable, c.labels())
}

// withDefaults fills in Role and Node where they are empty.
func (c Config) withDefaults(role, node string) Config {
	if c.Role == "" {
		c.Role = role
	}
	if c.Node == "" {
		c.Node = node
	}
	return c
}
