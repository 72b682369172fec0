package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/membership"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardnet"
)

// RoleConfig configures one process of a job whose roles run in separate processes: a
// parameter server (RunServer), a worker (RunWorker) or the coordinator (RunCoordinator: the
// elastic coordinator with the data-shard dispatcher). Every process of a job gets the same
// Config (data, model, optimizers, checkpoint directory) and the same PS list and Secret. Each
// process serves one authenticated port: a server its pulls, pushes and the coordinator's
// control calls; the coordinator the dispatcher and the workers' control calls.
type RoleConfig struct {
	Config
	// ID names this parameter server (one of PS) or worker.
	ID string
	// Listen is the address a parameter server or the coordinator serves on. A parameter
	// server's must be its address in PS (the same port, and the same host unless it listens on
	// every interface): RunServer refuses another, which nobody would reach.
	Listen string
	// PS lists every parameter server of the job: ID and address.
	PS []ps.Node
	// Dispatcher is the coordinator's address (for workers).
	Dispatcher string
	// Workers is the number of workers the job is started with, for the coordinator's summary.
	// Barriers do not depend on it: they wait for every worker that joined and is alive.
	Workers int
	// Secret is the cluster secret.
	Secret []byte
	// Gossip, if set, is the address (host:port) this process gossips membership on, and
	// Seeds the gossip addresses of the job's other processes (any that answers will do): the
	// coordinator then hears of a failed server or worker as soon as gossip notices it, which
	// it confirms by a health call. Without Gossip, health checks, silence and lease expiry
	// alone find failures.
	Gossip string
	Seeds  []string

	// Scaler, if set, runs the job's servers and workers for the coordinator (on Kubernetes,
	// elastic/kube's): RunCoordinator hands it to the coordinator, so that a plan asked for
	// through the control port (dlrm scale -ps N -workers M) starts and stops them, and calls
	// OnCoordinator, if set, with the coordinator once made (the scaler reports to it the
	// processes that end).
	Scaler        elastic.Scaler
	OnCoordinator func(*elastic.Coordinator)
	// HandOver makes an interrupted coordinator leave its job running for another coordinator
	// to take over, as on Kubernetes, where the coordinator's pod is deleted or moved while the
	// job goes on: no final checkpoint, the workers are not told to stop, and RunCoordinator
	// returns ErrHandedOver. Without it an interrupt ends the job after a final checkpoint.
	HandOver bool
}

// ErrHandedOver is returned by RunCoordinator when it was interrupted with HandOver set: the job
// goes on, for the next coordinator to take over.
var ErrHandedOver = errors.New("train: the coordinator was interrupted and left the job running for the next coordinator")

// startGossip gossips as role id (incarnation inc, serving RPC at addr) when rc.Gossip is set,
// and joins rc.Seeds (those other than its own address) in the background until one answers,
// so that the job's processes may start in any order; onEvent, if set, receives the events. The
// returned function leaves the gossip and stops it.
func startGossip(ctx context.Context, rc RoleConfig, role elastic.Role, id string, inc uint64, addr string, onEvent func(elastic.MemberEvent)) (stop func(), err error) {
	if rc.Gossip == "" {
		return func() {}, nil
	}
	m, err := membership.New(ctx, membership.Config{
		Self:   elastic.Member{Role: role, ID: id, Incarnation: inc, Addr: addr},
		Bind:   rc.Gossip,
		Secret: rc.Secret, OnEvent: onEvent, Logger: rc.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("gossip on %s: %w", rc.Gossip, err)
	}
	var seeds []string
	for _, a := range rc.Seeds {
		if a != rc.Gossip && a != m.LocalAddr() {
			seeds = append(seeds, a)
		}
	}
	jctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(seeds) > 0 {
			if _, err := m.Join(jctx, seeds...); err == nil {
				return
			}
			select {
			case <-time.After(gossipRetry):
			case <-jctx.Done():
				return
			}
		}
	}()
	return func() {
		cancel()
		<-done
		m.Close()
	}, nil
}

// gossipRetry is the wait between attempts to join the job's gossip.
const gossipRetry = time.Second

// untilUp runs f until it does not fail for want of a process that is not up yet
// (elastic.ErrUnavailable), waiting retryEvery between tries, and returns its error, or ctx's.
func untilUp(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil || !errors.Is(err, elastic.ErrUnavailable) {
			return err
		}
		select {
		case <-time.After(retryEvery):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ParseNodes reads "ID=HOST:PORT,..." (or "HOST:PORT,...", named ps-0, ps-1, ...).
func ParseNodes(s string) ([]ps.Node, error) {
	parts, err := SplitList(s)
	if err != nil {
		return nil, err
	}
	var nodes []ps.Node
	seen := map[string]bool{}
	for i, p := range parts {
		id, addr := fmt.Sprintf("ps-%d", i), p
		if k, v, ok := cutEq(p); ok {
			id, addr = k, v
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("server %s: %w", id, err)
		}
		if seen[id] {
			return nil, fmt.Errorf("server %s named twice", id)
		}
		seen[id] = true
		nodes = append(nodes, ps.Node{ID: id, Addr: addr})
	}
	return nodes, nil
}

func cutEq(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == '=' {
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}

// prepare checks rc and fills its defaults for a process of role; the records of its logger
// name the job, the role and the node.
func (rc *RoleConfig) prepare(role elastic.Role) error {
	if err := rc.Config.Validate(); err != nil {
		return err
	}
	rc.Config.fill()
	if rc.Logger == nil {
		rc.Logger = discardLogger()
	}
	node := rc.ID
	if role == elastic.RoleCoordinator && node == "" {
		node = elastic.CoordinatorID
	}
	rc.Logger = rc.Logger.With("job", jobName, "role", role.String(), "node", node)
	var errs []error
	if len(rc.Secret) == 0 {
		errs = append(errs, errors.New("a cluster secret is required"))
	}
	if len(rc.PS) == 0 {
		errs = append(errs, errors.New("the parameter servers' addresses are required"))
	}
	return errors.Join(errs...)
}

// modelShape returns the sparse field names of the data and the model's dense features (at
// least 1), without loading the data: what a parameter server needs to declare its tables.
func modelShape(cfg *Config) (fields []string, dense int, err error) {
	var schema shard.Schema
	switch cfg.Data.Kind {
	case Synthetic:
		sc := cfg.Synth
		sc.Seed = cfg.Seed
		gen, err := model.NewSynth(sc)
		if err != nil {
			return nil, 0, err
		}
		sc = gen.Config()
		for i := range sc.Vocab {
			schema.Fields = append(schema.Fields, fmt.Sprintf("C%d", i+1))
		}
		schema.Dense = sc.DenseFeatures
	case Criteo, LibSVM, LibFM:
		in, err := textParser(cfg) // libFM without -fields reads its count from the files
		if err != nil {
			return nil, 0, err
		}
		schema = in.parser.Schema()
	case MovieLens:
		schema = shard.MovieLensRatings{}.Schema()
		schema.Fields = movieLensFields(cfg)
	default:
		return nil, 0, fmt.Errorf("%w: unknown data kind", ErrConfig)
	}
	return schema.Fields, max(schema.Dense, 1), nil
}

// Timings of a multi-process job.
const (
	// workerSilence is how long the coordinator waits to hear from a worker (every batch it
	// begins and ends is a sign of life) before it fences it and hands its shards to others.
	workerSilence = 30 * time.Second
	// retryEvery is the wait between attempts to reach a process that is not up yet (untilUp).
	retryEvery = 200 * time.Millisecond
	// dispatcherRetries bounds a worker's consecutive failed calls to the dispatcher (with
	// backoff, about a minute): a worker whose coordinator is gone for good gives up.
	dispatcherRetries = 40
)

// RunServer runs a parameter server until ctx ends: it serves its tables and MLP tensors on
// rc.Listen, and the coordinator's control calls on the same port (owner table, fences,
// snapshots, restores). It sends EventStart to OnEvent once the port is bound and served.
func RunServer(ctx context.Context, rc RoleConfig) error {
	if err := rc.prepare(elastic.RoleServer); err != nil {
		return err
	}
	cfg := &rc.Config
	fields, dense, err := modelShape(cfg)
	if err != nil {
		return err
	}
	self, ok := nodeOf(rc.PS, rc.ID)
	if !ok {
		return fmt.Errorf("server %q is not in the server list", rc.ID)
	}
	if err := checkListen(ctx, rc.Listen, self); err != nil {
		return err
	}
	m0, err := model.New(model.Config{DenseFeatures: dense, Fields: len(fields), EmbeddingDim: cfg.EmbeddingDim,
		BottomHidden: cfg.BottomHidden, TopHidden: cfg.TopHidden, ConcatEmbeddings: cfg.ConcatEmbeddings == SwitchOn, Seed: cfg.Seed})
	if err != nil {
		return err
	}
	specs := tableSpecs(cfg, fields)
	specs = append(specs, denseSpecs(denseTensors(m0), cfg.denseOptimizer())...)
	var wg sync.WaitGroup
	defer wg.Wait() // last: after the server below is closed
	srv, err := ps.NewServer(ps.ServerConfig{ID: rc.ID, Secret: rc.Secret, Slots: cfg.Slots, Tables: specs, Logger: rc.Logger})
	if err != nil {
		return err
	}
	defer srv.Close()
	st, err := checkpoint.NewFSStorage(cfg.CheckpointDir)
	if err != nil {
		return err
	}
	shm, err := prepareShm(cfg, rc.ID, rc.Logger)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", rc.Listen)
	if err != nil {
		return err
	}
	// A damaged storage copy of a commit restored from shared memory is logged as a warning.
	ls, err := server.New(srv, l.Addr().String(), checkpoint.Config{Job: jobName, Storage: st,
		ShmDir: shm.dir, FullEvery: cfg.FullEvery, Logger: rc.Logger})
	if err != nil {
		l.Close()
		return err
	}
	defer func() {
		ls.Close()
		if !cfg.KeepShm {
			removeShm(shm, func(node string) bool { return node != rc.ID })
		}
	}()
	if err := remote.ServeServer(srv, ls); err != nil {
		l.Close()
		return err
	}
	wg.Add(1)
	go func() { defer wg.Done(); srv.Serve(l) }()
	stopGossip, err := startGossip(ctx, rc, elastic.RoleServer, rc.ID, ls.Incarnation(), l.Addr().String(), nil)
	if err != nil {
		return err
	}
	defer stopGossip()
	met, err := newMetered(cfg.MetricsAddr, elastic.RoleServer, rc.ID, false)
	if err == nil {
		err = met.server(srv)
	}
	if err == nil {
		err = met.serve(ctx, cfg.MetricsAddr, rc.Logger)
	}
	if err != nil {
		return err
	}
	defer met.close()
	rc.Logger.Info("parameter server up", "id", rc.ID, "addr", l.Addr().String())
	if rc.OnEvent != nil {
		rc.OnEvent(Event{Kind: EventStart, Message: fmt.Sprintf("parameter server %s serving on %s", rc.ID, l.Addr())})
		met.announce(rc.OnEvent)
	}
	<-ctx.Done()
	return nil
}

func nodeOf(nodes []ps.Node, id string) (ps.Node, bool) {
	for _, n := range nodes {
		if n.ID == id {
			return n, true
		}
	}
	return ps.Node{}, false
}

// listenLookupTimeout bounds the name lookups of checkListen.
const listenLookupTimeout = 5 * time.Second

// checkListen refuses a server whose listen address is not its address in the server list: the
// coordinator and the workers would dial the list's and never reach it. The ports must be the
// same; the hosts too, unless the server listens on every interface, or both names resolve to
// a common address. A name that does not resolve is given the benefit of the doubt.
func checkListen(ctx context.Context, listen string, self ps.Node) error {
	mismatch := func(why string) error {
		return fmt.Errorf("%w: server %s would listen on %s, but the server list gives its address as %s (%s): the coordinator and the workers would not reach it",
			ErrConfig, self.ID, listen, self.Addr, why)
	}
	lhost, lport, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("%w: server %s: listen address: %v", ErrConfig, self.ID, err)
	}
	host, port, err := net.SplitHostPort(self.Addr)
	if err != nil {
		return fmt.Errorf("%w: server %s: %v", ErrConfig, self.ID, err)
	}
	lp, lerr := net.LookupPort("tcp", lport)
	p, perr := net.LookupPort("tcp", port)
	if lerr != nil || perr != nil || lp != p {
		return mismatch("another port")
	}
	if ip := net.ParseIP(lhost); lhost == "" || ip != nil && ip.IsUnspecified() || lhost == host {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, listenLookupTimeout)
	defer cancel()
	lips, lerr := net.DefaultResolver.LookupIPAddr(lctx, lhost)
	ips, err := net.DefaultResolver.LookupIPAddr(lctx, host)
	if lerr != nil || err != nil {
		return nil
	}
	for _, a := range lips {
		for _, b := range ips {
			if a.IP.Equal(b.IP) {
				return nil
			}
		}
	}
	return mismatch("another host")
}

// RunCoordinator runs the coordinator of a multi-process job until the data is done or ctx
// ends: it places the slots on the servers of rc.PS, serves the data-shard dispatcher and the
// workers' control calls on rc.Listen (with the cluster secret), checkpoints every
// CheckpointEvery steps or CheckpointInterval (whichever comes first) at a barrier and once at
// the end, and commits each checkpoint with the
// dispatcher's snapshot and the exactly-once ledger. With Resume it first restores the newest
// commit into every server and restores the dispatcher and the ledger; a coordinator that finds
// its servers running the job (its predecessor died) takes the job over from the newest commit
// whether Resume is set or not. The returned summary holds the data, progress,
// exactly-once and checkpoint figures (the evaluation belongs to the embedded mode).
func RunCoordinator(ctx context.Context, rc RoleConfig) (*Summary, error) {
	if err := rc.prepare(elastic.RoleCoordinator); err != nil {
		return nil, err
	}
	cfg := &rc.Config
	if cfg.KeepBest == SwitchOn || cfg.EarlyStop > 0 { // by default a role job keeps no best
		return nil, fmt.Errorf("%w: keep-best and early stopping evaluate the held-out set, which only the embedded mode does", ErrConfig)
	}
	if cfg.Predictions != "" {
		return nil, fmt.Errorf("%w: predictions are written by the test evaluation, which only the embedded mode does", ErrConfig)
	}
	data, err := loadData(ctx, cfg)
	if err != nil {
		return nil, err
	}
	r := &run{cfg: *cfg, logger: rc.Logger, data: data}
	if r.metrics, err = newMetered(cfg.MetricsAddr, elastic.RoleCoordinator, elastic.CoordinatorID, true); err != nil {
		return nil, err
	}
	r.mcfg = model.Config{DenseFeatures: data.dense, Fields: len(data.fields), EmbeddingDim: cfg.EmbeddingDim,
		BottomHidden: cfg.BottomHidden, TopHidden: cfg.TopHidden, FieldPooling: data.pooling, Seed: cfg.Seed}
	m0, err := model.New(r.mcfg)
	if err != nil {
		return nil, err
	}
	r.mcfg = m0.Config()
	var remotes []*remote.Server
	var remotesMu sync.Mutex
	defer func() {
		remotesMu.Lock()
		defer remotesMu.Unlock()
		for _, rs := range remotes {
			rs.Close()
		}
	}()
	serverAt := func(n ps.Node) (elastic.ParameterServer, error) {
		rs, err := remote.NewServer(n, remote.Config{Secret: rc.Secret, Logger: rc.Logger})
		if err != nil {
			return nil, err
		}
		remotesMu.Lock()
		remotes = append(remotes, rs)
		remotesMu.Unlock()
		return rs, nil
	}
	servers := make([]elastic.ParameterServer, len(rc.PS))
	for i, n := range rc.PS {
		rs, err := serverAt(n)
		if err != nil {
			return nil, err
		}
		servers[i] = rs
	}
	// A coordinator started while its servers train (the previous one died) takes the job over,
	// -resume or not: it must not clear the checkpoints the job runs on.
	var running bool
	if err := untilUp(ctx, func() (err error) { running, err = elastic.JobRunning(ctx, servers); return err }); err != nil {
		return nil, err
	}
	if running && !cfg.Resume {
		rc.Logger.Warn("the parameter servers are running the job: taking it over from its newest commit")
		cfg.Resume = true
	}
	if running && cfg.Overwrite {
		rc.Logger.Warn("the parameter servers are running the job: its checkpoints are kept despite Overwrite")
	}
	st, err := openStorage(ctx, cfg, rc.Logger)
	if err != nil {
		return nil, err
	}
	// The servers may still be starting: the owner table is installed once they answer.
	var coord *elastic.Coordinator
	// The coordinator's dispatcher, once made. The samples a commit records are those its
	// dispatcher had accepted at the snapshot (the barrier is up: no batch ends meanwhile), not
	// those of the last progress report, which may be a report or more behind.
	var disp atomic.Pointer[shard.Dispatcher]
	err = untilUp(ctx, func() (err error) {
		coord, err = elastic.NewCoordinator(ctx, elastic.Config{
			Job: jobName, Servers: servers, Slots: cfg.Slots, Storage: st, Logger: rc.Logger,
			CheckpointEvery: max(cfg.CheckpointEvery, 0), CheckpointInterval: max(cfg.CheckpointInterval, 0),
			Dispatcher: r.dispatcherConfig(),
			JobState: func(step uint64) []byte {
				if d := disp.Load(); d != nil {
					r.samples.Store(acceptedBy(d))
				}
				return r.jobState(ctx, step)
			},
			CheckJob: r.checkJob, OnCheckpoint: r.onCheckpoint, OnRecovery: r.onRecovery,
			WorkerSilence: workerSilence, Recovery: cfg.Recovery,
			// Servers a scheduler adds (dlrm scale -add) are reached like these, and slots
			// move between servers over their ports.
			Secret: rc.Secret, ServerAt: serverAt,
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	defer coord.Close()
	if rc.Scaler != nil {
		coord.SetScaler(rc.Scaler)
	}
	if rc.OnCoordinator != nil {
		rc.OnCoordinator(coord)
	}
	disp.Store(coord.Dispatcher())
	accepted := func() int64 { return acceptedBy(coord.Dispatcher()) }
	sum := &Summary{Data: data.desc, HeldOut: data.heldOut, Servers: len(rc.PS), Workers: rc.Workers}
	if cfg.Resume {
		res, err := coord.ResumeReport(ctx)
		warnSkipped(res, cfg.CheckpointDir, r.emit)
		step, raw := res.Step, res.Job
		if errors.Is(err, checkpoint.ErrNoCheckpoint) {
			return nil, fmt.Errorf("%w in %s", ErrNoCheckpoint, cfg.CheckpointDir)
		}
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		if err := checkBatch(res.BatchSize, cfg.BatchSize); err != nil {
			return nil, err
		}
		var meta runMeta
		if len(raw) > 0 || step > 0 { // a running job taken over before its first commit has none
			if err := json.Unmarshal(raw, &meta); err != nil {
				return nil, fmt.Errorf("restore: run description: %w", err)
			}
		}
		// The restored dispatcher counts what the commit holds, whatever its run description
		// says (one written before its samples were counted at the snapshot falls short).
		base := accepted()
		sum.Resumed, sum.ResumedStep, sum.ResumedSamples = true, step, base
		r.baseSamp = base
		r.samples.Store(base)
		r.emit(Event{Kind: EventRestore, Message: fmt.Sprintf("restored checkpoint of step %d on %d servers and the dispatcher", step, len(rc.PS))})
	}

	// Serve the dispatcher and the control calls, only now: workers join a restored job.
	var wg sync.WaitGroup
	defer wg.Wait()
	dsrv, err := shardnet.NewServer(shardnet.ServerConfig{Service: coord.Service(), Secret: rc.Secret, Logger: rc.Logger})
	if err != nil {
		return nil, err
	}
	defer dsrv.Close()
	if err := remote.ServeControl(dsrv, coord); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", rc.Listen)
	if err != nil {
		return nil, err
	}
	wg.Add(1)
	go func() { defer wg.Done(); dsrv.Serve(l) }()
	stopGossip, err := startGossip(ctx, rc, elastic.RoleCoordinator, "coordinator", rand.Uint64()|1, l.Addr().String(), coord.Observe)
	if err != nil {
		return nil, err
	}
	defer stopGossip()
	r.emit(Event{Kind: EventStart, Message: fmt.Sprintf("coordinator: dispatcher and control on %s, %d servers; %s", l.Addr(), len(rc.PS), data.desc)})
	if err := r.watch.startPage(ctx, cfg.StatusAddr, rc.Secret, coord, rc.Logger); err != nil {
		return nil, err
	}
	defer r.watch.close()
	r.watch.announce(r.emit, false)
	r.metrics.coordinator(coord)
	if err := r.metrics.serve(ctx, cfg.MetricsAddr, rc.Logger); err != nil {
		return nil, err
	}
	defer r.metrics.close()
	r.metrics.announce(r.emit)

	r.start = time.Now()
	tick := time.NewTicker(cfg.ProgressEvery)
	defer tick.Stop()
	var deadline <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		deadline = t.C
	}
	reason := ""
	byDuration := false
	for reason == "" {
		select {
		case <-ctx.Done():
			if rc.HandOver {
				r.emit(Event{Kind: EventNote, Message: "interrupted: the job goes on for the next coordinator"})
				return nil, ErrHandedOver
			}
			reason = "interrupted"
		case <-coord.Done():
			// Another coordinator took the job over: this one's training stopped and nothing
			// more of it is committed. The job is the other's; end now, and say so.
			return nil, fmt.Errorf("coordinator: %w", coord.Err())
		case <-deadline:
			reason, byDuration = "stopped by -duration", true
		case <-tick.C:
			coord.Dispatcher().Expire()
			if coord.Dispatcher().Progress().Finished {
				reason = "every epoch done"
				break
			}
			r.samples.Store(accepted())
			r.emit(Event{Kind: EventProgress})
		}
	}
	r.emit(Event{Kind: EventNote, Message: "stopping: " + reason})
	// A final checkpoint, then serve until the workers have left, so that each learns the job
	// is over rather than finding the coordinator gone.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalTimeout)
	failure := coord.Finish(fctx, !cfg.NoFinalCheckpoint, workerSilence)
	cancel()
	if !cfg.NoFinalCheckpoint {
		failure = checkCommitted(coord.Status(), failure)
	}
	sum.Checkpoints = r.ck.get()
	sum.Checkpoints.Dir = cfg.CheckpointDir
	sum.StopReason = reason
	sum.Elapsed = time.Since(r.start)
	sum.TotalSamples = accepted()
	sum.Samples = sum.TotalSamples - r.baseSamp
	if byDuration {
		sum.StopReason = stoppedByDuration(cfg, coord.Dispatcher().Progress(), -1) // the dispatcher counts positions, not samples
	}
	sum.Steps = int64(coord.Status().Step)
	if sec := sum.Elapsed.Seconds(); sec > 0 {
		sum.SamplesPerSec = float64(sum.Samples) / sec
	}
	sum.checkTraining(coord)
	if failure == nil && !sum.ExactlyOnce {
		failure = ErrNotExactlyOnce
	}
	return sum, failure
}

// acceptedBy returns the records d has accepted as trained, over every epoch: a multi-process
// job's samples.
func acceptedBy(d *shard.Dispatcher) int64 {
	var n int64
	for _, e := range d.Progress().EpochRecords {
		n += e.Done
	}
	return n
}

// workerCounters are one worker process's figures.
type workerCounters struct {
	samples atomic.Int64
	metrics *metered
}

func (c *workerCounters) trained(worker string, st stepFigures) {
	c.samples.Add(int64(st.samples))
	c.metrics.step(worker, st)
}

// RunWorker runs one worker until the data is done, the coordinator stops training, or ctx
// ends. It pulls from and pushes to the parameter servers of rc.PS, leases data shards from the
// coordinator's dispatcher at rc.Dispatcher, and trains through an elastic.Session: it joins
// the job (waiting for the coordinator), pauses at its checkpoint barriers, and every push
// carries its fence epoch and the batch's position. It returns the samples it trained.
func RunWorker(ctx context.Context, rc RoleConfig) (int64, error) {
	if err := rc.prepare(elastic.RoleWorker); err != nil {
		return 0, err
	}
	if rc.ID == "" || rc.Dispatcher == "" {
		return 0, fmt.Errorf("%w: a worker needs an ID and the dispatcher's address", ErrConfig)
	}
	cfg := &rc.Config
	data, err := loadData(ctx, cfg)
	if err != nil {
		return 0, err
	}
	mcfg := modelConfig(cfg, data)
	m0, err := model.New(mcfg)
	if err != nil {
		return 0, err
	}
	mcfg = m0.Config()
	dense := denseTensors(m0)
	tables := newSparseTables(data.fields, cfg.firstOrder())
	addrs := make([]string, len(rc.PS))
	for i, n := range rc.PS {
		addrs[i] = n.Addr
	}
	cli, err := ps.NewClient(ps.ClientConfig{Secret: rc.Secret, Servers: addrs, Logger: rc.Logger})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	control, err := remote.NewControl(remote.Config{Addr: rc.Dispatcher, Secret: rc.Secret, Logger: rc.Logger})
	if err != nil {
		return 0, err
	}
	defer control.Close()
	svc, err := shardnet.NewClient(shardnet.ClientConfig{Addr: rc.Dispatcher, Secret: rc.Secret, Logger: rc.Logger})
	if err != nil {
		return 0, err
	}
	defer svc.Close()
	sess, err := elastic.NewSession(elastic.SessionConfig{Worker: rc.ID, Control: control, Client: cli, Logger: rc.Logger,
		Reader: shard.ReaderConfig{Service: svc, Source: data.source, BatchSize: cfg.BatchSize, ReportEvery: 1, Seed: cfg.Seed,
			MaxRetries: dispatcherRetries}})
	if err != nil {
		return 0, err
	}
	defer sess.Close()
	// Join first (the coordinator serves workers once the job is restored), then make sure
	// every MLP tensor exists (the first caller wins: restored ones stay).
	if err := sess.Join(ctx); err != nil {
		return 0, err
	}
	// A worker serves nothing: its gossip address stands for its address.
	stopGossip, err := startGossip(ctx, rc, elastic.RoleWorker, rc.ID, rand.Uint64()|1, rc.Gossip, nil)
	if err != nil {
		return 0, err
	}
	defer stopGossip()
	if err := initDense(ctx, cli, dense, m0.Params(), cfg.denseOptimizer()); err != nil {
		return 0, err
	}
	w, err := newWorker(rc.ID, mcfg, sess, tables, dense)
	if err != nil {
		return 0, err
	}
	met, err := newMetered(cfg.MetricsAddr, elastic.RoleWorker, rc.ID, false)
	if err == nil {
		err = met.serve(ctx, cfg.MetricsAddr, rc.Logger)
	}
	if err != nil {
		return 0, err
	}
	defer met.close()
	if rc.OnEvent != nil {
		met.announce(rc.OnEvent)
	}
	c := workerCounters{metrics: met}
	err = w.run(ctx, &c)
	return c.samples.Load(), err
}
