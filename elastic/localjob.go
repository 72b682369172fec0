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
	Coordinator *Coordinator
	Servers     []*LocalServer

	secret []byte
	log    *slog.Logger
	wg     sync.WaitGroup

	mu      sync.Mutex
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
	j.Coordinator = c
	return j, nil
}

// Secret returns the cluster secret.
func (j *LocalJob) Secret() []byte { return j.secret }

// Client returns a new client of the job's servers that learns owner tables from the
// coordinator. The job closes it at Close.
func (j *LocalJob) Client() (*ps.Client, error) {
	cli, err := ps.NewClient(ps.ClientConfig{Secret: j.secret, Resolver: j.Coordinator, Logger: j.log})
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
	rc.Service = j.Coordinator.Service()
	return NewSession(SessionConfig{Worker: worker, Control: j.Coordinator, Client: cli, Reader: rc, Logger: j.log})
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
	clients := j.clients
	j.mu.Unlock()
	var errs []error
	if j.Coordinator != nil {
		errs = append(errs, j.Coordinator.Close())
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
