package local

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/server"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// Config configures a job whose coordinator and parameter servers run in this process,
// the servers serving on loopback TCP with the cluster secret. Its workers run in this process
// too (NewSession, Scaler): the coordinator is not served to other processes.
type Config struct {
	// Job names the job. Required.
	Job string
	// Servers is the number of parameter servers, named ps-0, ps-1, ... Default 2.
	Servers int
	// Tables are hosted by every server: the embedding tables and the dense tensors (TableSpec.Dense,
	// with TableSpec.Initial their initial values). They are fixed: an InitDense of a dense
	// tensor not declared here is refused (ps.ErrUnknownTable), since it could be neither
	// checkpointed nor moved.
	Tables []ps.TableSpec
	// Slots is the job's slot count. Default ps.DefaultSlots.
	Slots int
	// Secret is the cluster secret. Default: 32 random bytes.
	Secret []byte
	// Listen is the address servers listen on. Default "127.0.0.1:0".
	Listen string
	// TLS, when set, makes every connection of the job mutual TLS: the servers', the clients'
	// and the coordinator's (ps.LoadTLS reads it from files). Default nil: the secret-based
	// protocol.
	TLS *ps.TLS
	// Coordinator configures the coordinator; Job, Servers and Slots are filled in, and Secret
	// (when unset) and TLS (when unset and TLS is set) are the job's. Its Logger receives the
	// records of every part of the job, each with the attributes "job", "role" ("coordinator",
	// "ps" or "worker") and "node" (the node id).
	Coordinator elastic.Config
	// Checkpoint configures each server's checkpointer (ShmDir, FullEvery, Codec, ...); Job and
	// Storage are the coordinator's, Node, Slots and Tables the server's. Without a Gate the
	// servers share one, so no server's background work slows another's blocking copy.
	Checkpoint checkpoint.Config
	// KeepShm keeps the servers' shared-memory regions (Checkpoint.ShmDir/Job/ps-i) at Close,
	// so that the job started again on this host restores from them (Coordinator.Resume) rather
	// than from storage. Default false: Close removes them, for they hold a copy of every row
	// in the host's memory. A job without checkpoint storage makes none.
	KeepShm bool
}

// Job is a running local job. Close stops it.
type Job struct {
	// Servers are the job's parameter servers, ps-i at index i. RestartServer replaces
	// Servers[i]; read the slice while no server restarts.
	Servers []*server.Server

	secret []byte
	log    *slog.Logger      // the job's own records, on the coordinator's side
	jobLog *slog.Logger      // the records' logger before the role and node are added
	server ps.ServerConfig   // every server's but ID, for a restart
	ck     checkpoint.Config // every server's checkpointer's
	listen string
	wg     sync.WaitGroup

	keepShm bool
	regMu   sync.Mutex
	regions []string // the servers whose checkpointer made a shared-memory region

	mu      sync.Mutex
	cfg     elastic.Config // the coordinator's, for a restart; its Servers follow RestartServer
	coord   *elastic.Coordinator
	ready   chan struct{} // closed when a restarting coordinator has taken over; nil otherwise
	down    map[int]bool  // servers killed and not restarted since
	clients []*ps.Client
	closed  bool
}

// Start starts the servers and the coordinator of a local job.
func Start(ctx context.Context, cfg Config) (*Job, error) {
	if cfg.Servers == 0 {
		cfg.Servers = 2
	}
	if cfg.Servers < 0 {
		return nil, fmt.Errorf("%w: %d servers", elastic.ErrInvalidConfig, cfg.Servers)
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
	// Every record names the job, and the role and node id of the part that made it.
	jobLog := log.With("job", cfg.Job)
	j := &Job{secret: cfg.Secret, log: tagged(jobLog, elastic.RoleCoordinator, elastic.CoordinatorID), jobLog: jobLog, listen: cfg.Listen,
		ck: cfg.Checkpoint, down: map[int]bool{}, keepShm: cfg.KeepShm,
		server: ps.ServerConfig{Secret: cfg.Secret, Slots: cfg.Slots, Tables: cfg.Tables, TLS: cfg.TLS, DeclaredIn: "local.Config.Tables"}}
	j.ck.Job, j.ck.Storage = cfg.Job, cfg.Coordinator.Storage
	if j.ck.Logger == nil {
		j.ck.Logger = jobLog
	} else {
		j.ck.Logger = j.ck.Logger.With("job", cfg.Job)
	}
	if j.ck.Gate == nil {
		j.ck.Gate = checkpoint.NewCopyGate()
	}
	var servers []elastic.ParameterServer
	for i := range cfg.Servers {
		srv, l, ls, err := j.newServer(elastic.ServerID(i), cfg.Listen)
		if err != nil {
			j.Close()
			return nil, err
		}
		j.serve(srv, l)
		j.Servers = append(j.Servers, ls)
		servers = append(servers, ls)
	}
	cc := cfg.Coordinator
	cc.Job, cc.Servers, cc.Slots, cc.Logger = cfg.Job, servers, cfg.Slots, j.log
	if cc.Secret == nil {
		cc.Secret = cfg.Secret // the coordinator moves slots when the server count changes
	}
	if cc.TLS == nil && cfg.TLS != nil {
		cc.TLS = cfg.TLS.Client
	}
	c, err := elastic.NewCoordinator(ctx, cc)
	if err != nil {
		j.Close()
		return nil, err
	}
	j.cfg, j.coord = cc, c
	return j, nil
}

// newServer makes parameter server id, listening at addr, with its checkpointer; serve starts
// it.
func (j *Job) newServer(id, addr string) (*ps.Server, net.Listener, *server.Server, error) {
	sc := j.server
	sc.ID = id
	sc.Logger = tagged(j.jobLog, elastic.RoleServer, id)
	srv, err := ps.NewServer(sc)
	if err != nil {
		return nil, nil, nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		srv.Close()
		return nil, nil, nil, err
	}
	ck := j.ck
	ck.Logger = tagged(ck.Logger, elastic.RoleServer, id)
	ls, err := server.New(srv, l.Addr().String(), ck)
	if err != nil {
		l.Close()
		srv.Close()
		return nil, nil, nil, err
	}
	if j.ck.Storage != nil {
		j.regMu.Lock()
		if !slices.Contains(j.regions, id) {
			j.regions = append(j.regions, id)
		}
		j.regMu.Unlock()
	}
	return srv, l, ls, nil
}

// serve serves srv on l until srv closes. After Start, call it with j.mu held and the
// job not closed, so that Close waits for it.
func (j *Job) serve(srv *ps.Server, l net.Listener) {
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		if err := srv.Serve(l); err != nil {
			tagged(j.jobLog, elastic.RoleServer, srv.ID()).Error("parameter server stopped", "err", err)
		}
	}()
}

// Coordinator returns the job's coordinator (a new one after RestartCoordinator).
func (j *Job) Coordinator() *elastic.Coordinator {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.coord
}

// RestartCoordinator replaces the job's coordinator as a crash and a restart would: the
// coordinator stops at once (what it has not committed is lost, nobody is told), and a new one
// takes the running job over from the newest commit (Coordinator.Resume), while the servers
// serve and the workers train on. The workers' calls wait for the new coordinator; their
// sessions join it again, and the batches trained since the commit are replayed, each landing
// only on the servers that lack it. It returns the commit's step. It fails, and changes
// nothing, while a server is down (KillServer without RestartServer).
func (j *Job) RestartCoordinator(ctx context.Context) (uint64, error) {
	j.mu.Lock()
	if j.closed || j.ready != nil {
		j.mu.Unlock()
		return 0, fmt.Errorf("%w: the job is closed or its coordinator is restarting", elastic.ErrClosed)
	}
	if i, ok := j.downLocked(); ok {
		// A coordinator starts only when every server answers: the new one would fail, and
		// leave the job without any.
		j.mu.Unlock()
		return 0, fmt.Errorf("local: restart the coordinator: server %s is down (RestartServer it first)", elastic.ServerID(i))
	}
	old, ready, cfg := j.coord, make(chan struct{}), j.cfg
	j.ready = ready
	j.mu.Unlock()
	old.Close()
	c, err := elastic.NewCoordinator(ctx, cfg)
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
		return 0, fmt.Errorf("local: restart the coordinator: %w", err)
	}
	return step, nil
}

// KillServer crashes parameter server i (ps-i) as its process would die: it stops answering at
// once (its listener and connections close, calls in flight fail), its checkpointer stops, and
// nobody is told. Its shared-memory regions stay, as a crashed process's do. The coordinator
// finds it failed once it has not answered for elastic.Config.ServerTimeout (or at once when
// RestartServer hands it a new incarnation) and recovers by its elastic.Config.Recovery;
// without a restart, the surviving servers take its slots after elastic.Config.ReplaceWait. It
// fails while the server is down already or the coordinator is restarting.
func (j *Job) KillServer(i int) error {
	j.mu.Lock()
	if err := j.serverIndexLocked(i); err != nil {
		j.mu.Unlock()
		return err
	}
	switch {
	case j.closed || j.ready != nil:
		j.mu.Unlock()
		return fmt.Errorf("%w: the job is closed or its coordinator is restarting", elastic.ErrClosed)
	case j.down[i]:
		j.mu.Unlock()
		return fmt.Errorf("local: kill server %s: it is down already", elastic.ServerID(i))
	}
	j.down[i] = true
	s := j.Servers[i]
	j.mu.Unlock()
	err := errors.Join(s.Server().Close(), s.Close())
	if err != nil {
		return fmt.Errorf("local: kill server %s: %w", elastic.ServerID(i), err)
	}
	return nil
}

// RestartServer starts a new incarnation of parameter server i (ps-i), as its process would
// restart: a new server.Server with no rows and no owner table, at the same address when it is
// free (else at another), with a checkpointer on the same shared-memory directory. A server
// still up is killed first (KillServer, whose errors it returns). It replaces Servers[i], and
// the coordinator takes it (elastic.Coordinator.ReplaceServer): it fails the old incarnation if
// it had not yet, and restores the new one's slots by its elastic.Config.Recovery (a coordinator
// that gave the slots to the survivors already refuses it, and it serves nothing).
// RestartServer returns once the coordinator has it, not when it is restored:
// elastic.Config.OnRecovery reports that. It waits while the coordinator restarts. Restart one
// server from one goroutine at a time.
func (j *Job) RestartServer(ctx context.Context, i int) error {
	j.mu.Lock()
	err := j.serverIndexLocked(i)
	up := err == nil && !j.down[i]
	j.mu.Unlock()
	if err != nil {
		return err
	}
	if up {
		if err := j.KillServer(i); err != nil {
			return err
		}
	}
	j.mu.Lock()
	old := j.Servers[i]
	j.mu.Unlock()
	id := old.Node().ID
	srv, l, ls, err := j.newServer(id, old.Node().Addr)
	if err != nil {
		// The port was taken meanwhile: a restarted process may come up elsewhere.
		srv, l, ls, err = j.newServer(id, j.listen)
	}
	if err != nil {
		return fmt.Errorf("local: restart server %s: %w", id, err)
	}
	for {
		// The coordinator that takes the new server must be the one whose Config names it:
		// a coordinator restarting now may have read the old list.
		c, err := j.current(ctx)
		if err != nil {
			ls.Close()
			srv.Close()
			l.Close()
			return fmt.Errorf("local: restart server %s: %w", id, err)
		}
		j.mu.Lock()
		if j.closed || j.ready != nil || j.coord != c {
			j.mu.Unlock()
			continue
		}
		j.Servers[i] = ls
		j.cfg.Servers = slices.Clone(j.cfg.Servers)
		j.cfg.Servers[i] = ls
		delete(j.down, i)
		j.serve(srv, l)
		j.mu.Unlock()
		if err := c.ReplaceServer(ls); err != nil {
			return fmt.Errorf("local: restart server %s: %w", id, err)
		}
		return nil
	}
}

// StartServers starts n more parameter servers, ps-k .. ps-(k+n-1) after the job's k, serving
// and with no owner table, and adds them to Servers; the coordinator moves slots onto them
// (Coordinator.SetParallelism, through a Scaler).
func (j *Job) StartServers(ctx context.Context, n int) ([]elastic.ParameterServer, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil, elastic.ErrClosed
	}
	var out []elastic.ParameterServer
	for range n {
		srv, l, ls, err := j.newServer(elastic.ServerID(len(j.Servers)), j.listen)
		if err != nil {
			return out, fmt.Errorf("local: start server %s: %w", elastic.ServerID(len(j.Servers)), err)
		}
		j.serve(srv, l)
		j.Servers = append(j.Servers, ls)
		j.cfg.Servers = append(slices.Clone(j.cfg.Servers), ls)
		out = append(out, ls)
	}
	return out, nil
}

// StopServers stops the parameter servers with the given ids, which must be the
// highest-numbered ones and own no slot (the coordinator drained them), and drops them from
// Servers.
func (j *Job) StopServers(ctx context.Context, ids []string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	k := len(j.Servers) - len(ids)
	if k < 0 {
		return fmt.Errorf("%w: stop %d of %d servers", elastic.ErrInvalidConfig, len(ids), len(j.Servers))
	}
	for n, id := range ids {
		i := slices.IndexFunc(j.Servers, func(s *server.Server) bool { return s.Node().ID == id })
		if i < k || slices.Contains(ids[:n], id) {
			return fmt.Errorf("%w: server %q is not among the highest-numbered %d (or named twice)", elastic.ErrInvalidConfig, id, len(ids))
		}
	}
	var errs []error
	for i := k; i < len(j.Servers); i++ {
		if !j.down[i] {
			errs = append(errs, j.Servers[i].Server().Close())
		}
		errs = append(errs, j.Servers[i].Close())
		delete(j.down, i)
	}
	j.Servers = j.Servers[:k]
	j.cfg.Servers = slices.DeleteFunc(slices.Clone(j.cfg.Servers), func(s elastic.ParameterServer) bool { return slices.Contains(ids, s.Node().ID) })
	return errors.Join(errs...)
}

// ServerList returns the job's servers now: a copy of Servers read under the job's lock, for a
// reader that runs while servers start, stop or restart (a metrics scrape, a status page).
func (j *Job) ServerList() []*server.Server {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.Servers)
}

func (j *Job) serverCount() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.Servers)
}

// serverIndexLocked checks that i names a server of the job.
func (j *Job) serverIndexLocked(i int) error {
	if i < 0 || i >= len(j.Servers) {
		return fmt.Errorf("%w: no server %d (the job has %d)", elastic.ErrInvalidConfig, i, len(j.Servers))
	}
	return nil
}

// downLocked returns a server killed and not restarted, if any.
func (j *Job) downLocked() (int, bool) {
	for i := range j.Servers {
		if j.down[i] {
			return i, true
		}
	}
	return 0, false
}

// Secret returns the cluster secret.
func (j *Job) Secret() []byte { return j.secret }

// Digest returns the digest of the job's model, every table and dense tensor on every server,
// taken with training held at a barrier (Coordinator.Digest; its Step is the job's step then).
// Compare it with DigestCommit's: the commit of that step holds the same model, and so does the
// job restored from it onto any number of servers.
func (j *Job) Digest(ctx context.Context) (d checkpoint.Digest, err error) {
	err = j.call(ctx, func(c *elastic.Coordinator) (err error) { d, err = c.Digest(ctx); return err })
	return d, err
}

// DigestCommit returns the digest of the model the commit of step holds, read from storage
// (Coordinator.DigestCommit).
func (j *Job) DigestCommit(ctx context.Context, step uint64) (d checkpoint.Digest, err error) {
	err = j.call(ctx, func(c *elastic.Coordinator) (err error) { d, err = c.DigestCommit(ctx, step); return err })
	return d, err
}

// Client returns a new client of the job's servers that learns owner tables from the
// coordinator. The job closes it at Close. Its pushes carry no fence epoch (0), which the
// servers refuse (ps.ErrFenced) once a coordinator has resumed or taken the job over: its floor
// voids every epoch of the incarnations before it. Train through sessions (NewSession).
func (j *Job) Client() (*ps.Client, error) { return j.client(j.jobLog) }

// client is Client, logging to log.
func (j *Job) client(log *slog.Logger) (*ps.Client, error) {
	cli, err := ps.NewClient(ps.ClientConfig{Secret: j.secret, Resolver: jobControl{j}, Logger: log, TLS: j.server.TLS.ClientTLS()})
	if err != nil {
		return nil, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		cli.Close()
		return nil, elastic.ErrClosed
	}
	j.clients = append(j.clients, cli)
	return cli, nil
}

// NewSession returns a session of an in-process worker: its own client, the coordinator's
// dispatcher, and reader settings rc (Source and BatchSize; Service is set here).
func (j *Job) NewSession(worker string, rc shard.ReaderConfig) (*elastic.Session, error) {
	log := tagged(j.jobLog, elastic.RoleWorker, worker)
	cli, err := j.client(log)
	if err != nil {
		return nil, err
	}
	rc.Service = jobService{j}
	return elastic.NewSession(elastic.SessionConfig{Worker: worker, Control: jobControl{j}, Client: cli, Reader: rc, Logger: log})
}

// Close stops the coordinator, the clients and the servers, and closes the checkpointers. It
// removes the shared-memory regions the servers made, unless Config.KeepShm keeps them for a
// restart on this host; what is in storage stays either way. Idempotent.
func (j *Job) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	clients, coord, servers := j.clients, j.coord, slices.Clone(j.Servers)
	j.mu.Unlock()
	var errs []error
	if coord != nil {
		errs = append(errs, coord.Close())
	}
	for _, c := range clients {
		errs = append(errs, c.Close())
	}
	for _, s := range servers {
		errs = append(errs, s.Server().Close(), s.Close())
	}
	j.wg.Wait()
	if !j.keepShm {
		j.regMu.Lock()
		for _, id := range j.regions {
			errs = append(errs, checkpoint.DeleteRegion(j.ck.ShmDir, j.ck.Job, id))
		}
		j.regMu.Unlock()
	}
	return errors.Join(errs...)
}

// current returns the job's coordinator, waiting while it is being restarted.
func (j *Job) current(ctx context.Context) (*elastic.Coordinator, error) {
	for {
		j.mu.Lock()
		c, ready, closed := j.coord, j.ready, j.closed
		j.mu.Unlock()
		switch {
		case closed:
			return nil, elastic.ErrClosed
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
func (j *Job) call(ctx context.Context, f func(c *elastic.Coordinator) error) error {
	for {
		c, err := j.current(ctx)
		if err != nil {
			return err
		}
		err = f(c)
		if !errors.Is(err, elastic.ErrClosed) {
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
	jobControl struct{ j *Job }
	jobService struct{ j *Job }
)

var (
	_ elastic.Control      = jobControl{}
	_ ps.Resolver          = jobControl{}
	_ shard.ReportAcquirer = jobService{}
	_ shard.ShardAwaiter   = jobService{}
)

func (jc jobControl) Join(ctx context.Context, worker string, batchSize int) (epoch uint64, err error) {
	err = jc.j.call(ctx, func(c *elastic.Coordinator) (err error) { epoch, err = c.Join(ctx, worker, batchSize); return err })
	return epoch, err
}

func (jc jobControl) Begin(ctx context.Context, worker string, epoch uint64) error {
	return jc.j.call(ctx, func(c *elastic.Coordinator) error { return c.Begin(ctx, worker, epoch) })
}

func (jc jobControl) End(ctx context.Context, worker string, epoch uint64, ok bool) error {
	return jc.j.call(ctx, func(c *elastic.Coordinator) error { return c.End(ctx, worker, epoch, ok) })
}

func (jc jobControl) Leave(ctx context.Context, worker string, epoch uint64) error {
	return jc.j.call(ctx, func(c *elastic.Coordinator) error { return c.Leave(ctx, worker, epoch) })
}

// call runs f on the coordinator's dispatcher; once the job is closed its errors say that
// retrying cannot help.
func (jc jobService) call(ctx context.Context, f func(c *elastic.Coordinator) error) error {
	err := jc.j.call(ctx, f)
	if errors.Is(err, elastic.ErrClosed) && !errors.Is(err, shard.ErrPermanent) {
		err = errDispatcherClosed
	}
	return err
}

func (jc jobService) Acquire(ctx context.Context, worker string) (l shard.Lease, err error) {
	err = jc.call(ctx, func(c *elastic.Coordinator) (err error) { l, err = c.Service().Acquire(ctx, worker); return err })
	return l, err
}

func (jc jobService) Report(ctx context.Context, worker string, lease shard.LeaseID, offset int64, done bool) error {
	return jc.call(ctx, func(c *elastic.Coordinator) error { return c.Service().Report(ctx, worker, lease, offset, done) })
}

func (jc jobService) ReportAndAcquire(ctx context.Context, worker string, lease shard.LeaseID, offset int64) (l shard.Lease, err error) {
	err = jc.call(ctx, func(c *elastic.Coordinator) (err error) {
		l, err = shard.ReportAndAcquire(ctx, c.Service(), worker, lease, offset)
		return err
	})
	return l, err
}

func (jc jobService) AwaitShard(ctx context.Context) error {
	return jc.call(ctx, func(c *elastic.Coordinator) error { return shard.AwaitShard(ctx, c.Service()) })
}

func (jc jobService) Leave(ctx context.Context, worker string) error {
	return jc.call(ctx, func(c *elastic.Coordinator) error { return c.Service().Leave(ctx, worker) })
}

func (jc jobControl) OwnerTable(ctx context.Context, minVersion uint64) (t *ps.OwnerTable, err error) {
	err = jc.j.call(ctx, func(c *elastic.Coordinator) (err error) { t, err = c.OwnerTable(ctx, minVersion); return err })
	return t, err
}

// SetScaler makes s the scaler of the job's coordinator, and of every coordinator
// RestartCoordinator starts (Coordinator.SetScaler): say, a Scaler of this job's workers.
func (j *Job) SetScaler(s elastic.Scaler) {
	j.mu.Lock()
	j.cfg.Scaler = s
	c := j.coord
	j.mu.Unlock()
	if c != nil {
		c.SetScaler(s)
	}
}

// errDispatcherClosed is a dispatcher call's error once the job is closed: retrying cannot help.
var errDispatcherClosed = fmt.Errorf("%w: its dispatcher is gone with it (%w)", elastic.ErrClosed, shard.ErrPermanent)

// Unreachable implements ps.UnreachableReporter for a Job's clients.
func (jc jobControl) Unreachable(ctx context.Context, server string, err error) {
	jc.Suspect(ctx, server, err.Error())
}

// Suspect takes a Job's workers' reports of unreachable servers (Coordinator.Suspect).
func (jc jobControl) Suspect(ctx context.Context, server, reason string) error {
	return jc.j.call(ctx, func(c *elastic.Coordinator) error { return c.Suspect(ctx, server, reason) })
}

var _ ps.UnreachableReporter = jobControl{}

// RestartServerByID is RestartServer of the server with that node id; reason is for the log.
// It is what an autoscaler's restart hook calls (autoscale.RunnerConfig.RestartServer).
func (j *Job) RestartServerByID(ctx context.Context, id, reason string) error {
	for i, s := range j.Servers {
		if s.Node().ID == id {
			j.log.Info("restarting a parameter server", "server", id, "reason", reason)
			return j.RestartServer(ctx, i)
		}
	}
	return fmt.Errorf("%w: restart %s: the job has no such server", elastic.ErrInvalidConfig, id)
}

// tagged is log with the role and node id of the part of the job that logs.
func tagged(log *slog.Logger, role elastic.Role, node string) *slog.Logger {
	return log.With("role", role.String(), "node", node)
}
