package elastic

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// LocalConfig configures a job whose coordinator and parameter servers run in this process,
// the servers serving on loopback TCP with the cluster secret. Workers may run here (NewSession)
// or anywhere that can reach the servers.
type LocalConfig struct {
	// Job names the job. Required.
	Job string
	// Servers is the number of parameter servers, named ps-0, ps-1, ... Default 2.
	Servers int
	// Tables are hosted by every server.
	Tables []ps.TableSpec
	// Slots is the job's slot count. Default ps.DefaultSlots.
	Slots int
	// Secret is the cluster secret. Default: 32 random bytes.
	Secret []byte
	// Listen is the address servers listen on. Default "127.0.0.1:0".
	Listen string
	// Coordinator configures the coordinator; Job, Servers and Slots are filled in.
	Coordinator Config
	// Checkpoint configures each server's checkpointer (ShmDir, FullEvery, Codec, ...); Job and
	// Storage are the coordinator's, Node, Slots and Tables the server's.
	Checkpoint checkpoint.Config
}

// LocalJob is a running local job. Close stops it.
type LocalJob struct {
	Servers []*LocalServer

	secret []byte
	log    *slog.Logger
	cfg    Config // the coordinator's, for a restart
	wg     sync.WaitGroup

	mu      sync.Mutex
	coord   *Coordinator
	ready   chan struct{} // closed when a restarting coordinator has taken over; nil otherwise
	clients []*ps.Client
	closed  bool
}

// StartLocal starts the servers and the coordinator of a local job.
func StartLocal(ctx context.Context, cfg LocalConfig) (*LocalJob, error) {
	if cfg.Servers == 0 {
		cfg.Servers = 2
	}
	if cfg.Servers < 0 {
		return nil, fmt.Errorf("%w: %d servers", ErrInvalidConfig, cfg.Servers)
	}
	if cfg.Slots == 0 {
		cfg.Slots = ps.DefaultSlots
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if len(cfg.Secret) == 0 {
		cfg.Secret = make([]byte, 32)
		rand.Read(cfg.Secret)
	}
	log := cfg.Coordinator.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	j := &LocalJob{secret: cfg.Secret, log: log}
	ck := cfg.Checkpoint
	ck.Job, ck.Storage = cfg.Job, cfg.Coordinator.Storage
	if ck.Logger == nil {
		ck.Logger = log
	}
	var servers []ParameterServer
	for i := range cfg.Servers {
		srv, err := ps.NewServer(ps.ServerConfig{ID: fmt.Sprintf("ps-%d", i), Secret: cfg.Secret, Slots: cfg.Slots, Tables: cfg.Tables, Logger: log})
		if err != nil {
			j.Close()
			return nil, err
		}
		l, err := net.Listen("tcp", cfg.Listen)
		if err != nil {
			srv.Close()
			j.Close()
			return nil, err
		}
		ls, err := NewLocalServer(srv, l.Addr().String(), ck)
		if err != nil {
			l.Close()
			srv.Close()
			j.Close()
			return nil, err
		}
		j.wg.Add(1)
		go func() {
			defer j.wg.Done()
			if err := srv.Serve(l); err != nil {
				log.Error("parameter server stopped", "server", srv.ID(), "err", err)
			}
		}()
		j.Servers = append(j.Servers, ls)
		servers = append(servers, ls)
	}
	cc := cfg.Coordinator
	cc.Job, cc.Servers, cc.Slots = cfg.Job, servers, cfg.Slots
	c, err := NewCoordinator(ctx, cc)
	if err != nil {
		j.Close()
		return nil, err
	}
	j.cfg, j.coord = cc, c
	return j, nil
}

// Coordinator returns the job's coordinator (a new one after RestartCoordinator).
func (j *LocalJob) Coordinator() *Coordinator {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.coord
}

// RestartCoordinator replaces the job's coordinator as a crash and a restart would: the
// coordinator stops at once (what it has not committed is lost, nobody is told), and a new one
// takes the running job over from the newest commit (Coordinator.Resume), while the servers
// serve and the workers train on. The workers' calls wait for the new coordinator; their
// sessions join it again, and the batches trained since the commit are replayed, each landing
// only on the servers that lack it. It returns the commit's step.
func (j *LocalJob) RestartCoordinator(ctx context.Context) (uint64, error) {
	j.mu.Lock()
	if j.closed || j.ready != nil {
		j.mu.Unlock()
		return 0, fmt.Errorf("%w: the job is closed or its coordinator is restarting", ErrClosed)
	}
	old, ready := j.coord, make(chan struct{})
	j.ready = ready
	j.mu.Unlock()
	old.Close()
	c, err := NewCoordinator(ctx, j.cfg)
	var step uint64
	if err == nil {
		if step, _, err = c.Resume(ctx); err != nil {
			c.Close()
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if err == nil {
		j.coord = c
	}
	j.ready = nil
	close(ready)
	if err != nil {
		return 0, fmt.Errorf("elastic: restart the coordinator: %w", err)
	}
	return step, nil
}

// Secret returns the cluster secret.
func (j *LocalJob) Secret() []byte { return j.secret }

// Client returns a new client of the job's servers that learns owner tables from the
// coordinator. The job closes it at Close.
func (j *LocalJob) Client() (*ps.Client, error) {
	cli, err := ps.NewClient(ps.ClientConfig{Secret: j.secret, Resolver: jobControl{j}, Logger: j.log})
	if err != nil {
		return nil, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		cli.Close()
		return nil, ErrClosed
	}
	j.clients = append(j.clients, cli)
	return cli, nil
}

// NewSession returns a session of an in-process worker: its own client, the coordinator's
// dispatcher, and reader settings rc (Source and BatchSize; Service is set here).
func (j *LocalJob) NewSession(worker string, rc shard.ReaderConfig) (*Session, error) {
	cli, err := j.Client()
	if err != nil {
		return nil, err
	}
	rc.Service = jobService{j}
	return NewSession(SessionConfig{Worker: worker, Control: jobControl{j}, Client: cli, Reader: rc, Logger: j.log})
}

// Close stops the coordinator, the clients and the servers, and closes the checkpointers (the
// shared-memory regions stay for a restart on this host). Idempotent.
func (j *LocalJob) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	clients, coord := j.clients, j.coord
	j.mu.Unlock()
	var errs []error
	if coord != nil {
		errs = append(errs, coord.Close())
	}
	for _, c := range clients {
		errs = append(errs, c.Close())
	}
	for _, s := range j.Servers {
		errs = append(errs, s.Server().Close(), s.Close())
	}
	j.wg.Wait()
	return errors.Join(errs...)
}

// current returns the job's coordinator, waiting while it is being restarted.
func (j *LocalJob) current(ctx context.Context) (*Coordinator, error) {
	for {
		j.mu.Lock()
		c, ready, closed := j.coord, j.ready, j.closed
		j.mu.Unlock()
		switch {
		case closed:
			return nil, ErrClosed
		case ready == nil:
			return c, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// call runs f on the job's coordinator; one that closed because it was being replaced is
// replaced by the next, as a remote coordinator that restarts at its address is.
func (j *LocalJob) call(ctx context.Context, f func(c *Coordinator) error) error {
	for {
		c, err := j.current(ctx)
		if err != nil {
			return err
		}
		err = f(c)
		if !errors.Is(err, ErrClosed) {
			return err
		}
		j.mu.Lock()
		replaced := j.coord != c || j.ready != nil
		j.mu.Unlock()
		if !replaced {
			return err
		}
	}
}

// jobControl and jobService are the job's coordinator as its in-process workers reach it
// (Control, ps.Resolver; the dispatcher), across restarts of the coordinator.
type (
	jobControl struct{ j *LocalJob }
	jobService struct{ j *LocalJob }
)

var (
	_ Control              = jobControl{}
	_ ps.Resolver          = jobControl{}
	_ shard.ReportAcquirer = jobService{}
)

func (jc jobControl) Join(ctx context.Context, worker string) (epoch uint64, err error) {
	err = jc.j.call(ctx, func(c *Coordinator) (err error) { epoch, err = c.Join(ctx, worker); return err })
	return epoch, err
}

func (jc jobControl) Begin(ctx context.Context, worker string, epoch uint64) error {
	return jc.j.call(ctx, func(c *Coordinator) error { return c.Begin(ctx, worker, epoch) })
}

func (jc jobControl) End(ctx context.Context, worker string, epoch uint64, ok bool) error {
	return jc.j.call(ctx, func(c *Coordinator) error { return c.End(ctx, worker, epoch, ok) })
}

func (jc jobControl) Leave(ctx context.Context, worker string, epoch uint64) error {
	return jc.j.call(ctx, func(c *Coordinator) error { return c.Leave(ctx, worker, epoch) })
}

// call runs f on the coordinator's dispatcher; once the job is closed its errors say that
// retrying cannot help.
func (jc jobService) call(ctx context.Context, f func(c *Coordinator) error) error {
	err := jc.j.call(ctx, f)
	if errors.Is(err, ErrClosed) && !errors.Is(err, shard.ErrPermanent) {
		err = errDispatcherClosed
	}
	return err
}

func (jc jobService) Acquire(ctx context.Context, worker string) (l shard.Lease, err error) {
	err = jc.call(ctx, func(c *Coordinator) (err error) { l, err = c.svc.Acquire(ctx, worker); return err })
	return l, err
}

func (jc jobService) Report(ctx context.Context, worker string, lease shard.LeaseID, offset int64, done bool) error {
	return jc.call(ctx, func(c *Coordinator) error { return c.svc.Report(ctx, worker, lease, offset, done) })
}

func (jc jobService) ReportAndAcquire(ctx context.Context, worker string, lease shard.LeaseID, offset int64) (l shard.Lease, err error) {
	err = jc.call(ctx, func(c *Coordinator) (err error) {
		l, err = c.svc.ReportAndAcquire(ctx, worker, lease, offset)
		return err
	})
	return l, err
}

func (jc jobService) Leave(ctx context.Context, worker string) error {
	return jc.call(ctx, func(c *Coordinator) error { return c.svc.Leave(ctx, worker) })
}

func (jc jobControl) OwnerTable(ctx context.Context, minVersion uint64) (t *ps.OwnerTable, err error) {
	err = jc.j.call(ctx, func(c *Coordinator) (err error) { t, err = c.OwnerTable(ctx, minVersion); return err })
	return t, err
}
