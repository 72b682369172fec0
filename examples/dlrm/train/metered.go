package train

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/metrics"
	"github.com/elasticps/elasticps/ps"
	"github.com/prometheus/client_golang/prometheus"
)

// metered is a process's Prometheus metrics (package metrics), served on Config.MetricsAddr:
// the coordinator's, its servers' and its workers' series, as many of them as run in the
// process. Its methods do nothing on a nil metered or one with no registry (no address given).
type metered struct {
	reg   *prometheus.Registry
	coord *metrics.Coordinator
	addr  string // where it serves, once it does

	mu      sync.Mutex
	workers map[string]*metrics.Worker

	serving
}

// newMetered makes the registry of a process of role, with its process's series, when addr is
// set (nil otherwise); withCoordinator adds the coordinator's series, whose source is set later.
func newMetered(addr string, role elastic.Role, node string, withCoordinator bool) (*metered, error) {
	if addr == "" {
		return &metered{}, nil
	}
	m := &metered{reg: prometheus.NewRegistry(), workers: map[string]*metrics.Worker{}}
	if err := metrics.RegisterProcess(m.reg, metrics.Config{Job: jobName, Role: role.String(), Node: node}); err != nil {
		return nil, err
	}
	if withCoordinator {
		c, err := metrics.NewCoordinator(metrics.Config{Job: jobName})
		if err != nil {
			return nil, err
		}
		if err := m.reg.Register(c); err != nil {
			return nil, err
		}
		m.coord = c
	}
	return m, nil
}

// serve serves the registry on addr until close, logging to log.
func (m *metered) serve(ctx context.Context, addr string, log *slog.Logger) error {
	if m == nil || m.reg == nil {
		return nil
	}
	at, err := m.listen(ctx, addr, "metrics", log, func(ctx context.Context, ln net.Listener) error {
		return metrics.Serve(ctx, ln, m.reg, log)
	})
	if err != nil {
		return err
	}
	m.addr = at.String()
	return nil
}

// announce says where the metrics are, in a Note event.
func (m *metered) announce(emit func(Event)) {
	if m != nil && m.addr != "" {
		emit(Event{Kind: EventNote, Message: fmt.Sprintf("metrics at http://%s%s", m.addr, metrics.Path)})
	}
}

// close stops serving and waits for it.
func (m *metered) close() {
	if m != nil {
		m.serving.close()
	}
}

// coordinator points the coordinator's series at src.
func (m *metered) coordinator(src metrics.StatusSource) {
	if m != nil && m.coord != nil {
		m.coord.SetSource(src)
	}
}

func (m *metered) checkpoint(ev elastic.CheckpointEvent) {
	if m != nil && m.coord != nil {
		m.coord.ObserveCheckpoint(ev)
	}
}

func (m *metered) recovery(ev elastic.RecoveryEvent) {
	if m != nil && m.coord != nil {
		m.coord.ObserveRecovery(ev)
	}
}

// server adds the series of a server of this process.
func (m *metered) server(srv *ps.Server) error {
	if m == nil || m.reg == nil {
		return nil
	}
	s, err := metrics.NewServer(srv, metrics.Config{Job: jobName})
	if err != nil {
		return err
	}
	return m.reg.Register(s)
}

// localServers adds the series of a local job's servers, those it has at each scrape (servers
// start, stop and restart while it trains).
func (m *metered) localServers(job *local.Job) error {
	if m == nil || m.reg == nil {
		return nil
	}
	return m.reg.Register(&jobServers{job: job, each: map[string]*jobServer{}})
}

// step records a worker's step in its series, made at its first step.
func (m *metered) step(worker string, st stepFigures) {
	if m == nil || m.reg == nil {
		return
	}
	m.mu.Lock()
	w, ok := m.workers[worker]
	if !ok {
		var err error
		if w, err = metrics.NewWorker(metrics.Config{Job: jobName, Node: worker}); err == nil {
			err = m.reg.Register(w)
		}
		if err != nil {
			w = nil // a worker's series that cannot be made are left out
		}
		m.workers[worker] = w
	}
	m.mu.Unlock()
	if w != nil {
		w.ObserveStep(metrics.Step{Pull: st.pull, Compute: st.compute, Push: st.push, Samples: st.samples, Loss: st.loss})
	}
}

// jobServers collects the series of a local job's servers of the moment. It describes nothing
// in advance (an unchecked collector): its servers come and go.
type jobServers struct {
	job *local.Job

	mu   sync.Mutex
	each map[string]*jobServer // by node id, kept across restarts for the hottest slots' memory
}

// jobServer is one node's series, reading whichever server the node runs now.
type jobServer struct {
	mu  sync.Mutex
	srv *ps.Server
	m   *metrics.Server
}

func (s *jobServer) Stats(withRows bool) ps.ServerStats {
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	return srv.Stats(withRows)
}

func (j *jobServers) Describe(chan<- *prometheus.Desc) {}

func (j *jobServers) Collect(ch chan<- prometheus.Metric) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, s := range j.job.ServerList() {
		id := s.Node().ID
		e, ok := j.each[id]
		if !ok {
			e = &jobServer{}
			m, err := metrics.NewServer(e, metrics.Config{Job: jobName, Node: id})
			if err != nil {
				continue
			}
			e.m = m
			j.each[id] = e
		}
		e.mu.Lock()
		e.srv = s.Server()
		e.mu.Unlock()
		e.m.Collect(ch)
	}
}
