package elastictest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
)

// CoordinatorHost is the memory network's host of a Job's coordinator: its dispatcher and its
// control calls listen there, and it dials the servers from there when slots move.
const CoordinatorHost = "coordinator"

// Secret returns the cluster secret of the jobs of this package (a test's, never a real one).
func Secret() []byte { return []byte("the elastictest cluster secret.!") }

// Config configures a Job. The zero value of every field but Coordinator.Dispatcher.Dataset
// means its default.
type Config struct {
	// T, if set, is the test the job belongs to: the job is closed when it ends (t.Cleanup).
	T testing.TB
	// Job names the job. Default "test".
	Job string
	// Servers is the number of parameter servers, ps-0 .. ps-(n-1), each on the memory
	// network's host of its name. Default 2.
	Servers int
	// Slots is the job's slot count. Default 64: small tables keep tests fast.
	Slots int
	// Tables are hosted by every server, and fixed (ps.ServerConfig.DeclaredIn).
	Tables []ps.TableSpec
	// Coordinator configures the coordinator; Job, Servers, Slots, Secret, Transport and
	// ServerAt are filled in (a Transport or ServerAt set here is kept).
	Coordinator elastic.Config
	// Checkpoint configures each server's checkpointer when Coordinator.Storage is set; Job and
	// Storage are the coordinator's. Its ShmDir defaults to a directory of the job's own, made
	// at Start and removed at Close.
	Checkpoint checkpoint.Config
	// WrapServer, if set, gives the coordinator each server as it returns it (a FaultServer,
	// say): the servers of Start and of StartServers alike.
	WrapServer func(elastic.ParameterServer) elastic.ParameterServer
	// Logger receives the servers', the workers' and (unless its own is set) the coordinator's
	// events. Nil discards.
	Logger *slog.Logger
}

// Job is a whole elastic job in one process on an in-memory network: parameter servers, each
// on its own host, a coordinator whose dispatcher and control calls are served on host
// CoordinatorHost, and workers (Session) on hosts of their own, so that the network's faults
// (Partition, Kill, ...) cut what a real network would. The coordinator reaches its servers
// in-process (server.Server); slots move between servers over the network.
//
// A Job is safe for concurrent use. Close is idempotent and joins every goroutine.
type Job struct {
	net    *memnet.Network
	cfg    Config // with defaults
	coord  *elastic.Coordinator
	ctl    *shardnet.Server
	addr   string // the coordinator's
	shmDir string // made by Start; removed at Close
	wg     sync.WaitGroup

	mu       sync.Mutex
	servers  []*ps.Server
	ls       []net.Listener // servers[i]'s
	locals   []*server.Server
	wrapped  []elastic.ParameterServer
	sessions []func() // close a worker's session and clients
	closed   bool
}

// Start starts a job: its servers, its coordinator, and the coordinator's service on the
// network. Workers join with Session.
func Start(ctx context.Context, cfg Config) (*Job, error) {
	if cfg.Job == "" {
		cfg.Job = "test"
	}
	if cfg.Servers == 0 {
		cfg.Servers = 2
	}
	if cfg.Slots == 0 {
		cfg.Slots = 64
	}
	if cfg.Servers < 0 || cfg.Slots < 0 {
		return nil, fmt.Errorf("%w: %d servers, %d slots", elastic.ErrInvalidConfig, cfg.Servers, cfg.Slots)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	j := &Job{net: memnet.New(memnet.Config{}), cfg: cfg}
	if cfg.Coordinator.Storage != nil && cfg.Checkpoint.ShmDir == "" {
		dir, err := os.MkdirTemp("", "elastictest-shm-")
		if err != nil {
			return nil, err
		}
		j.shmDir, j.cfg.Checkpoint.ShmDir = dir, dir
	}
	j.cfg.Checkpoint.Job, j.cfg.Checkpoint.Storage = cfg.Job, cfg.Coordinator.Storage
	if j.cfg.Checkpoint.Logger == nil {
		j.cfg.Checkpoint.Logger = cfg.Logger
	}
	if _, err := j.StartServers(ctx, cfg.Servers); err != nil {
		j.Close()
		return nil, err
	}
	cc := cfg.Coordinator
	cc.Job, cc.Slots, cc.Secret = cfg.Job, cfg.Slots, Secret()
	j.mu.Lock()
	cc.Servers = slices.Clone(j.wrapped)
	j.mu.Unlock()
	host := j.net.Host(CoordinatorHost)
	if cc.Transport == nil {
		cc.Transport = host
	}
	if cc.ServerAt == nil {
		cc.ServerAt = func(node ps.Node) (elastic.ParameterServer, error) {
			return remote.NewServer(node, remote.Config{Secret: Secret(), Transport: host, Logger: cfg.Logger})
		}
	}
	if cc.Logger == nil {
		cc.Logger = cfg.Logger
	}
	c, err := elastic.NewCoordinator(ctx, cc)
	if err != nil {
		j.Close()
		return nil, err
	}
	j.coord = c
	if j.ctl, err = shardnet.NewServer(shardnet.ServerConfig{Service: c.Service(), Secret: Secret(), Logger: cfg.Logger}); err == nil {
		err = remote.ServeControl(j.ctl, c)
	}
	if err != nil {
		j.Close()
		return nil, err
	}
	l, err := host.Listen(CoordinatorHost + ":1")
	if err != nil {
		j.Close()
		return nil, err
	}
	j.addr = l.Addr().String()
	j.wg.Go(func() { j.ctl.Serve(l) })
	if cfg.T != nil {
		cfg.T.Cleanup(func() { j.Close() })
	}
	return j, nil
}

// Coordinator returns the job's coordinator.
func (j *Job) Coordinator() *elastic.Coordinator { return j.coord }

// Addr returns the address of the coordinator's dispatcher and control calls
// (remote.NewControl, shardnet.NewClient) on the network, from host CoordinatorHost.
func (j *Job) Addr() string { return j.addr }

// Servers returns the job's parameter servers, ps-i at index i.
func (j *Job) Servers() []*ps.Server {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.servers)
}

// ParameterServers returns the job's servers as the coordinator was given them (after
// Config.WrapServer), ps-i at index i.
func (j *Job) ParameterServers() []elastic.ParameterServer {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.wrapped)
}

// StartServers starts n more parameter servers, ps-k .. ps-(k+n-1) after the job's k, serving
// on the network with no owner table, and returns them as Config.WrapServer gives them; the
// coordinator moves slots onto them (AddServers, or SetParallelism through a ServerScaler such
// as a Recorder with the job as its Pool).
func (j *Job) StartServers(ctx context.Context, n int) ([]elastic.ParameterServer, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil, elastic.ErrClosed
	}
	var out []elastic.ParameterServer
	for range n {
		id := elastic.ServerID(len(j.servers))
		srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: Secret(), Slots: j.cfg.Slots, Tables: j.cfg.Tables,
			Transport: j.net.Host(id), Logger: j.cfg.Logger, DeclaredIn: "elastictest.Config.Tables"})
		if err != nil {
			return out, fmt.Errorf("elastictest: start server %s: %w", id, err)
		}
		l, err := j.net.Host(id).Listen(id + ":1")
		if err != nil {
			srv.Close()
			return out, fmt.Errorf("elastictest: start server %s: %w", id, err)
		}
		ls, err := server.New(srv, l.Addr().String(), j.cfg.Checkpoint)
		if err != nil {
			l.Close()
			srv.Close()
			return out, fmt.Errorf("elastictest: start server %s: %w", id, err)
		}
		j.wg.Go(func() { srv.Serve(l) })
		var p elastic.ParameterServer = ls
		if j.cfg.WrapServer != nil {
			p = j.cfg.WrapServer(ls)
		}
		j.servers, j.ls, j.locals, j.wrapped = append(j.servers, srv), append(j.ls, l), append(j.locals, ls), append(j.wrapped, p)
		out = append(out, p)
	}
	return out, nil
}

// StopServers stops the parameter servers with the given ids, which must be the job's
// highest-numbered (the coordinator drained them), and drops them from the job.
func (j *Job) StopServers(ctx context.Context, ids []string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := highest(ids, len(j.servers)); err != nil {
		return err
	}
	k := len(j.servers) - len(ids)
	var errs []error
	for i := k; i < len(j.servers); i++ {
		errs = append(errs, j.servers[i].Close(), j.locals[i].Close())
		j.ls[i].Close() // free the address at once (the server's own close of it may come later)
	}
	j.servers, j.ls, j.locals, j.wrapped = j.servers[:k], j.ls[:k], j.locals[:k], j.wrapped[:k]
	return errors.Join(errs...)
}

// Session returns the session of a worker named name on the network's host of that name: its
// parameter-server client, its dispatcher client and its coordinator client all go over the
// host's links. rc is its reader's configuration (Source and BatchSize; Service is set here).
// The job closes the session and its clients at Close.
func (j *Job) Session(name string, rc shard.ReaderConfig) (*elastic.Session, error) {
	return j.SessionOn(name, name, rc)
}

// SessionOn is Session on host: a second process under a name another one uses, say.
func (j *Job) SessionOn(host, name string, rc shard.ReaderConfig) (*elastic.Session, error) {
	// Made under the lock (nothing here waits for the network), so that Close closes what it
	// makes: a session made after Close would wait for a coordinator that is gone to leave.
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil, elastic.ErrClosed
	}
	h := j.net.Host(host)
	log := j.cfg.Logger
	cli, err := ps.NewClient(ps.ClientConfig{Secret: Secret(), Transport: h, Resolver: j.coord, Logger: log})
	if err != nil {
		return nil, err
	}
	svc, err := shardnet.NewClient(shardnet.ClientConfig{Addr: j.addr, Secret: Secret(), Transport: h, Logger: log})
	if err != nil {
		cli.Close()
		return nil, err
	}
	ctl, err := remote.NewControl(remote.Config{Addr: j.addr, Secret: Secret(), Transport: h, Logger: log})
	if err != nil {
		svc.Close()
		cli.Close()
		return nil, err
	}
	rc.Service = svc
	sess, err := elastic.NewSession(elastic.SessionConfig{Worker: name, Control: ctl, Client: cli, Reader: rc, Logger: log})
	if err != nil {
		ctl.Close()
		svc.Close()
		cli.Close()
		return nil, err
	}
	j.sessions = append(j.sessions, func() {
		sess.Close()
		ctl.Close()
		svc.Close()
		cli.Close()
	})
	return sess, nil
}

// Partition cuts both directions between hosts a and b (a worker's name, a server's node id,
// CoordinatorHost): dials fail, and bytes on open connections are held until Heal.
func (j *Job) Partition(a, b string) { j.net.Partition(a, b) }

// Heal ends a Partition of a and b.
func (j *Job) Heal(a, b string) { j.net.Heal(a, b) }

// SetDrop makes the bytes from host from to host to vanish (drop true) or flow again.
func (j *Job) SetDrop(from, to string, drop bool) { j.net.SetDrop(from, to, drop) }

// Kill crashes host: its listeners close, its connections are reset, and it can neither dial
// nor be dialed until Restart.
func (j *Job) Kill(host string) { j.net.Kill(host) }

// Restart brings a killed host back (its programs must listen again).
func (j *Job) Restart(host string) { j.net.Restart(host) }

// Close stops the workers' sessions, the coordinator and the servers, and waits for them.
// Idempotent.
func (j *Job) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	sessions := j.sessions
	j.mu.Unlock()
	for _, f := range sessions {
		f()
	}
	var errs []error
	if j.ctl != nil {
		errs = append(errs, j.ctl.Close())
	}
	if j.coord != nil {
		errs = append(errs, j.coord.Close())
	}
	j.mu.Lock()
	for i, s := range j.servers {
		errs = append(errs, s.Close(), j.locals[i].Close())
	}
	j.mu.Unlock()
	j.wg.Wait()
	if j.shmDir != "" {
		errs = append(errs, os.RemoveAll(j.shmDir))
	}
	return errors.Join(errs...)
}
