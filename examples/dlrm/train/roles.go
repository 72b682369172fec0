package train

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/examples/dlrm/internal/ctl"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
)

// RoleConfig configures one process of a job whose roles run in separate processes: a
// parameter server (RunServer), a worker (RunWorker) or the coordinator serving the data-shard
// dispatcher and driving checkpoints (RunCoordinator). Every process of a job gets the same
// Config (data, model, optimizers, checkpoint directory) and the same PS list and Secret.
type RoleConfig struct {
	Config
	// ID names this parameter server (one of PS) or worker.
	ID string
	// Listen is the address a parameter server or the coordinator serves on. Its control
	// channel listens on ControlAddr(Listen).
	Listen string
	// PS lists every parameter server of the job: ID and address.
	PS []ps.Node
	// Dispatcher is the coordinator's address (for workers).
	Dispatcher string
	// Workers is the number of workers the job is started with, for the coordinator's summary.
	// Barriers do not depend on it: they wait for every worker registered and alive, and a
	// worker applies nothing before it has registered.
	Workers int
	// Secret is the cluster secret.
	Secret []byte
}

// ControlPortOffset is added to a serving port to get its control port.
const ControlPortOffset = 100

// ControlAddr returns the address of the control channel beside a serving address: the same
// host, the port plus ControlPortOffset.
func ControlAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p+ControlPortOffset > 65535 {
		return "", fmt.Errorf("address %s: want a numeric port below %d", addr, 65536-ControlPortOffset)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+ControlPortOffset)), nil
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

func (rc *RoleConfig) prepare() error {
	if err := rc.Config.Validate(); err != nil {
		return err
	}
	rc.Config.fill()
	if rc.Logger == nil {
		rc.Logger = discardLogger()
	}
	var errs []error
	if len(rc.Secret) == 0 {
		errs = append(errs, errors.New("a cluster secret is required"))
	}
	if len(rc.PS) == 0 {
		errs = append(errs, errors.New("the parameter servers' addresses are required"))
	}
	return errors.Join(errs...)
}

// fieldNames returns the sparse field names of the data, without loading it.
func fieldNames(cfg *Config) ([]string, error) {
	switch cfg.Data.Kind {
	case Synthetic:
		sc := cfg.Synth
		sc.Seed = cfg.Seed
		if err := sc.Validate(); err != nil {
			return nil, err
		}
		n := len(sc.Vocab)
		if n == 0 {
			n = 26
		}
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("C%d", i+1)
		}
		return out, nil
	case Criteo:
		return shard.Criteo{}.Schema().Fields, nil
	case LibSVM:
		return shard.LibSVM{}.Schema().Fields, nil
	case MovieLens:
		return shard.MovieLensRatings{}.Schema().Fields, nil
	}
	return nil, fmt.Errorf("%w: unknown data kind", ErrConfig)
}

// RunServer runs a parameter server until ctx ends: it serves its tables and MLP tensors on
// rc.Listen, checkpoints them when the coordinator says so, and restores them on its command.
func RunServer(ctx context.Context, rc RoleConfig) error {
	if err := rc.prepare(); err != nil {
		return err
	}
	cfg := &rc.Config
	fields, err := fieldNames(cfg)
	if err != nil {
		return err
	}
	specs := tableSpecs(fields, cfg.EmbeddingDim, cfg.Seed, cfg.EmbeddingOptimizer, cfg.EmbeddingInit)
	table, err := ps.NewOwnerTable(1, cfg.Slots, rc.PS, nil)
	if err != nil {
		return err
	}
	if table.IndexOf(rc.ID) < 0 {
		return fmt.Errorf("server %q is not in the server list", rc.ID)
	}
	var wg sync.WaitGroup
	defer wg.Wait() // last: after the servers below are closed
	srv, err := ps.NewServer(ps.ServerConfig{ID: rc.ID, Secret: rc.Secret, Slots: cfg.Slots, Tables: specs, Logger: rc.Logger})
	if err != nil {
		return err
	}
	defer srv.Close()
	if _, err := srv.SetOwnerTable(table); err != nil {
		return err
	}
	l, err := net.Listen("tcp", rc.Listen)
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() { defer wg.Done(); srv.Serve(l) }()

	holder := &ps.TableHolder{}
	holder.Set(table)
	cli, err := ps.NewClient(ps.ClientConfig{Secret: rc.Secret, Resolver: holder, Logger: rc.Logger})
	if err != nil {
		return err
	}
	defer cli.Close()
	st, err := checkpoint.NewFSStorage(cfg.CheckpointDir)
	if err != nil {
		return err
	}
	shmDir, prev, err := placeShm(cfg, rc.ID)
	if err != nil {
		return err
	}
	if prev != "" {
		if err := checkpoint.DeleteRegion(prev, jobName, rc.ID); err != nil {
			rc.Logger.Warn("shared memory of an earlier run left behind", "dir", prev, "err", err)
		}
	}
	if !cfg.Resume {
		if err := checkpoint.DeleteRegion(shmDir, jobName, rc.ID); err != nil {
			return err
		}
		// Regions of servers an earlier run had and this job has not: no one deletes them
		// otherwise. Those of the job's other servers, and regions in use, stay.
		inJob := map[string]bool{}
		for _, n := range rc.PS {
			inJob[n.ID] = true
		}
		if err := deleteRegions(shmDir, func(node string) bool { return inJob[node] }, true); err != nil {
			rc.Logger.Warn("shared memory of an earlier run left behind", "dir", shmDir, "err", err)
		}
	}
	tabs := map[string]checkpoint.Table{}
	for _, s := range specs {
		t, _ := srv.Table(s.Name)
		tabs[s.Name] = t
	}
	ck, err := checkpoint.New(checkpoint.Config{Job: jobName, Node: rc.ID, Tables: tabs, Storage: st, Slots: cfg.Slots,
		ShmDir: shmDir, FullEvery: cfg.FullEvery, Logger: rc.Logger})
	if err != nil {
		return err
	}
	defer func() {
		ck.Close()
		if !cfg.KeepShm {
			checkpoint.DeleteRegion(shmDir, jobName, rc.ID)
		}
	}()
	set := table.SlotsOf(rc.ID)
	var owned []int
	for s := range cfg.Slots {
		if set.Has(s) {
			owned = append(owned, s)
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	svc := &psService{ctx: sctx, id: rc.ID, srv: srv, ck: ck, cli: cli, table: table, owned: owned}
	cs, err := ctl.NewServer(rc.Secret, "PS", svc)
	if err != nil {
		return err
	}
	defer cs.Close()
	caddr, err := ControlAddr(l.Addr().String())
	if err != nil {
		return err
	}
	cl, err := net.Listen("tcp", caddr)
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() { defer wg.Done(); cs.Serve(cl) }()
	rc.Logger.Info("parameter server up", "id", rc.ID, "addr", l.Addr().String(), "control", caddr, "slots", len(owned))
	<-ctx.Done()
	return nil
}

// psService is a parameter server's control service.
type psService struct {
	ctx   context.Context
	id    string
	srv   *ps.Server
	ck    *checkpoint.Checkpointer
	cli   *ps.Client
	table *ps.OwnerTable
	owned []int
}

// Snapshot snapshots the server's rows and MLP tensors at a step. Both generations busy is
// answered Busy (the coordinator skips the checkpoint), except for the final checkpoint, which
// waits for the persists and tries again.
func (s *psService) Snapshot(a ctl.SnapshotArgs, r *ctl.SnapshotReply) error {
	t0 := time.Now()
	dense, err := encodeDense(s.srv)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		info, err := s.ck.Snapshot(s.ctx, a.Step, checkpoint.SnapshotSlots(s.owned), checkpoint.SnapshotBlob(denseBlobName, dense))
		if errors.Is(err, checkpoint.ErrBusy) {
			if !a.Final || attempt == finalBusyRetries {
				*r = ctl.SnapshotReply{Busy: true, Blocked: time.Since(t0)}
				return nil
			}
			if err := s.ck.Flush(s.ctx); err != nil {
				return fmt.Errorf("wait for earlier persists: %w", err)
			}
			continue
		}
		if err != nil {
			return err
		}
		*r = ctl.SnapshotReply{Bytes: info.Bytes, Full: info.Full, Blocked: time.Since(t0)}
		return nil
	}
}

// WaitPersisted waits for the persist of a step and returns its manifest.
func (s *psService) WaitPersisted(a ctl.Step, r *ctl.ManifestReply) error {
	ref, err := s.ck.WaitPersisted(s.ctx, a.Step)
	r.Ref = ref
	return err
}

// Verify checks that this server can restore a committed step.
func (s *psService) Verify(a ctl.Step, _ *ctl.Empty) error {
	return s.ck.Verify(s.ctx, a.Step, checkpoint.RestoreSlots(s.owned))
}

// errNotFresh is returned by PS.Load on a server that has applied updates since it started.
var errNotFresh = errors.New("train: a checkpoint is restored only into a parameter server that has applied no update since it started; restart every process of the job to resume")

// Load restores a committed step: the rows of the owned slots and the MLP tensors this server
// owns now. It refuses a server that has applied a push since it started (its tables would mix
// the checkpoint with later updates), and fails if a push arrives while it loads.
func (s *psService) Load(a ctl.Step, r *ctl.LoadReply) error {
	if name, ok := updatedTable(s.srv); ok {
		return fmt.Errorf("server %s: table %s holds trained rows: %w", s.id, name, errNotFresh)
	}
	before := s.srv.Stats(false).Pushes
	if err := s.load(a, r); err != nil {
		return err
	}
	if after := s.srv.Stats(false).Pushes; after != before {
		return fmt.Errorf("server %s received %d pushes while it restored step %d: %w", s.id, after-before, a.Step, errNotFresh)
	}
	return nil
}

// updatedTable returns a table of srv (embedding table or MLP tensor) holding a row that an
// update has changed, if any. Rows created by pulls hold their initial values, which a restore
// may leave alone.
func updatedTable(srv *ps.Server) (string, bool) {
	for _, name := range srv.TableNames() {
		t, ok := srv.Table(name)
		if !ok {
			continue
		}
		updated := false
		t.Range(func(v embedding.RowView) bool {
			updated = v.Freq > 0
			return !updated
		})
		if updated {
			return name, true
		}
	}
	return "", false
}

func (s *psService) load(a ctl.Step, r *ctl.LoadReply) error {
	res, err := s.ck.Load(s.ctx, a.Step, checkpoint.RestoreSlots(s.owned),
		checkpoint.RestoreBlobs(func(_, name string) bool { return name == denseBlobName }))
	if err != nil {
		return err
	}
	var entries []denseEntry
	seen := map[string]bool{}
	for _, b := range res.Blobs {
		if seen[b.Node] {
			continue
		}
		seen[b.Node] = true
		e, err := decodeDense(b.Data)
		if err != nil {
			return err
		}
		entries = append(entries, e...)
	}
	owns := func(name string) bool { return s.table.Owner(s.table.NameSlot(name)).ID == s.id }
	n, err := restoreDense(s.ctx, s.cli, entries, owns, func(name string) (*embedding.Table, bool) { return s.srv.Table(name) })
	if err != nil {
		return err
	}
	for _, rec := range res.Records {
		r.Records += rec
	}
	r.Dense = n
	for node, src := range res.Sources {
		r.Sources += fmt.Sprintf("%s: %s ", node, src)
	}
	return nil
}
