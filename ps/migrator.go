package ps

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/internal/rpc"
	"golang.org/x/sync/errgroup"
)

// MigratorConfig configures a Migrator. Secret is required.
type MigratorConfig struct {
	// Secret is the cluster secret (the servers'), at least MinSecretSize bytes.
	Secret []byte
	// Protection is what every frame to the servers carries. Default ProtectIntegrity.
	Protection Protection
	// Transport dials the servers. Nil means TCP.
	Transport Transport
	// TLS, when set, is the client side of mutual TLS (TLS.Client); the servers must use TLS.
	TLS *tls.Config
	// Concurrency bounds the migrations under way at once; each moves one group of slots
	// between one pair of servers. Default 4.
	Concurrency int
	// GroupSlots is the most slots one migration moves: they are copied, fenced and handed over
	// together, and each group costs its source one pass over its rows. Default 1024.
	GroupSlots int
	// Bandwidth caps the bytes per second each migration copies; 0 means no cap.
	Bandwidth int64
	// MaxRounds, SmallRound and ChunkBytes are passed to each migration (MigrationSpec).
	MaxRounds, SmallRound, ChunkBytes int
	// StepWait bounds how long a handover waits for synchronous servers (ServerConfig.SyncWorkers)
	// to reach a step boundary; a group that waits longer is called off. Default 30s.
	StepWait time.Duration
	// Logger receives each migration's start, end and failure. Nil discards.
	Logger *slog.Logger
}

func (c MigratorConfig) withDefaults() MigratorConfig {
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.GroupSlots == 0 {
		c.GroupSlots = 1024
	}
	if c.StepWait == 0 {
		c.StepWait = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports every problem with c in one error wrapping ErrBadConfig, or nil.
func (c MigratorConfig) Validate() error {
	c = c.withDefaults()
	var errs []error
	if err := rpc.ValidateSecret(c.Secret); err != nil {
		errs = append(errs, err)
	}
	if c.Concurrency < 1 || c.Concurrency > 1024 {
		errs = append(errs, fmt.Errorf("Concurrency %d not in 1..1024", c.Concurrency))
	}
	if c.GroupSlots < 1 {
		errs = append(errs, fmt.Errorf("GroupSlots %d must be positive", c.GroupSlots))
	}
	if c.Bandwidth < 0 {
		errs = append(errs, fmt.Errorf("Bandwidth %d is negative", c.Bandwidth))
	}
	if c.StepWait < 0 {
		errs = append(errs, fmt.Errorf("StepWait %v is negative", c.StepWait))
	}
	if err := (MigrationSpec{MaxRounds: c.MaxRounds, SmallRound: c.SmallRound, ChunkBytes: c.ChunkBytes}).validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadConfig, errors.Join(errs...))
}

// Migrator changes a job's placement while it trains: it moves only the slots whose owner
// changes, a group at a time between one pair of servers, several groups at once, and
// publishes an owner table after each group (see Server.ReceiveSlots for one migration). Safe
// for concurrent use; one Migrate runs at a time.
type Migrator struct {
	cfg  MigratorConfig
	log  *slog.Logger
	rpc  *rpc.Client
	ids  atomic.Uint64
	run  sync.Mutex // one Migrate at a time
	prog struct {
		sync.Mutex
		p MigrationProgress
	}
}

// MigrationProgress reports a Migrator's current or last Migrate.
type MigrationProgress struct {
	// Running is true while Migrate runs.
	Running bool
	// SlotsDone of SlotsTotal slots have their new owner published.
	SlotsDone, SlotsTotal int
	// Groups and GroupsDone count the migrations planned and finished; GroupsFailed those that
	// failed (their slots stayed with their source).
	Groups, GroupsDone, GroupsFailed int
	// Rows and Bytes count the records copied so far (a row changed during a move is copied
	// again); BaseRows counts only the base copies: the rows moved.
	Rows, Bytes, BaseRows int64
	// Version is the newest owner table published.
	Version uint64
	// MaxFenced is the longest a group's slots were fenced before their table went out.
	MaxFenced time.Duration
	// Started and Elapsed time the Migrate.
	Started time.Time
	Elapsed time.Duration
}

// NewMigrator returns a Migrator. It connects lazily.
func NewMigrator(cfg MigratorConfig) (*Migrator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	rc := rpc.ClientConfig{Secret: cfg.Secret, Logger: cfg.Logger, ConnsPerAddr: 1, Protection: cfg.Protection, TLS: cfg.TLS}
	if cfg.Transport != nil {
		rc.Transport = cfg.Transport
	}
	c, err := rpc.NewClient(rc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	m := &Migrator{cfg: cfg, log: cfg.Logger, rpc: c}
	m.ids.Store(rand.Uint64() &^ 0xffffffff) // ids unique across migrators, counting up
	return m, nil
}

// Close closes the Migrator's connections. It is idempotent.
func (m *Migrator) Close() error { return m.rpc.Close() }

// Progress returns the progress of the current or last Migrate.
func (m *Migrator) Progress() MigrationProgress {
	m.prog.Lock()
	defer m.prog.Unlock()
	p := m.prog.p
	if p.Running {
		p.Elapsed = time.Since(p.Started)
	}
	return p
}

func (m *Migrator) update(f func(p *MigrationProgress)) {
	m.prog.Lock()
	defer m.prog.Unlock()
	f(&m.prog.p)
}

// MigrateOption adjusts one Migrate.
type MigrateOption func(*migrateOpts)

type migrateOpts struct {
	lock func(ctx context.Context) (unlock func(), err error)
}

// WithPublishLock has Migrate take lock before it hands a group over (fences its slots on the
// source) and release it once the group's table is published; Publish is called with it held.
// A caller whose other work also changes or reads the owner table (checkpoints, recoveries)
// holds the same lock there: such work then never keeps slots fenced, since a handover and
// its publication are short and start only once the lock is had.
func WithPublishLock(lock func(ctx context.Context) (unlock func(), err error)) MigrateOption {
	return func(o *migrateOpts) { o.lock = lock }
}

// Publish makes t the job's owner table: the servers install it and clients can get it. It
// must record t as current before installing it anywhere, since some servers may serve by it
// even when Publish then fails.
type Publish func(ctx context.Context, t *OwnerTable) error

// Migrate moves the job from cur's placement to next's (next is typically NewOwnerTable over
// the new set of servers with cur as prev; its version is not used). The servers of both must
// be up and serving; cur must be what they have installed. Slots are moved in groups; after
// each group publish gets a table (versions counting up from cur's) that gives the group to its
// new owner and keeps every server of cur and next; the last table has next's placement and
// only next's servers. It returns the last table published.
//
// A group that fails leaves its slots with their source, fence lifted, and the other groups
// go on; Migrate then returns the last table published with an error wrapping ErrMigration,
// and nodes of cur that are not in next stay in it while they own slots. A Publish error stops
// Migrate at once and is returned with the table Publish was given, which is the job's from
// then on, unless the error wraps ErrNotPublished: then the group is called off and the table
// returned is the one before.
func (m *Migrator) Migrate(ctx context.Context, cur, next *OwnerTable, publish Publish, opts ...MigrateOption) (*OwnerTable, error) {
	m.run.Lock()
	defer m.run.Unlock()
	var o migrateOpts
	for _, opt := range opts {
		opt(&o)
	}
	if cur.Slots != next.Slots {
		return cur, fmt.Errorf("%w: slot count %d differs from %d", ErrBadConfig, next.Slots, cur.Slots)
	}
	nodes := unionNodes(cur.Nodes, next.Nodes)
	groups := m.group(cur.Moves(next))
	total := 0
	for _, g := range groups {
		total += len(g)
	}
	m.update(func(p *MigrationProgress) {
		*p = MigrationProgress{Running: true, SlotsTotal: total, Groups: len(groups), Version: cur.Version, Started: time.Now()}
	})
	defer m.update(func(p *MigrationProgress) { p.Running, p.Elapsed = false, time.Since(p.Started) })
	m.log.Info("migration starting", "slots", total, "groups", len(groups), "from_version", cur.Version, "servers_before", len(cur.Nodes), "servers_after", len(next.Nodes))

	var pubMu sync.Mutex
	published := cur
	var pubErr error
	var failed []error
	var failMu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(m.cfg.Concurrency)
	for _, moves := range groups {
		g.Go(func() error {
			if gctx.Err() != nil {
				return gctx.Err()
			}
			record := func(err error) {
				m.log.Warn("migration failed; its slots stay with their source", "from", moves[0].From, "to", moves[0].To, "slots", len(moves), "err", err)
				failMu.Lock()
				failed = append(failed, err)
				failMu.Unlock()
			}
			fail := func(err error) {
				record(err)
				m.update(func(p *MigrationProgress) { p.GroupsFailed++ })
			}
			id := m.ids.Add(1)
			st, err := m.moveGroup(gctx, nodes, moves, id, PhaseCopy)
			if err != nil {
				fail(err)
				return nil
			}
			// The handover and the publication, one group at a time, under the caller's
			// publish lock: the slots are refused from the fence until the table is out.
			pubMu.Lock()
			defer pubMu.Unlock()
			if pubErr != nil {
				// An earlier group's table did not go out: this one's never will.
				m.callOff(gctx, nodes, moves, id)
				return pubErr
			}
			unlock := func() {}
			if o.lock != nil {
				if unlock, err = o.lock(gctx); err != nil {
					m.callOff(gctx, nodes, moves, id)
					return err
				}
			}
			defer unlock()
			resume, err := m.pauseSteps(gctx, nodes, published)
			if err != nil {
				m.callOff(gctx, nodes, moves, id) // counts the group failed
				record(err)
				return nil
			}
			defer func() { resume(published.Version) }()
			hs, err := m.moveGroup(gctx, nodes, moves, id, PhaseHandover)
			if err != nil {
				fail(err)
				return nil
			}
			t, err := published.WithMoves(published.Version+1, nodes, moves)
			if err != nil {
				m.callOff(gctx, nodes, moves, id)
				return err
			}
			pubStart := time.Now()
			if err := publish(gctx, t); err != nil {
				pubErr = fmt.Errorf("publish owner table %d: %w", t.Version, err)
				if errors.Is(err, ErrNotPublished) {
					m.callOff(gctx, nodes, moves, id)
				} else {
					published = t
					// The source may have installed t: then it drops the slots and its
					// tracking now (it refuses while it still owns them).
					m.release(gctx, nodes, moves[0].From, id)
				}
				return pubErr
			}
			published = t
			fenced := hs.Fenced + time.Since(pubStart)
			rows, bytes := st.Rows+hs.Rows, st.Bytes+hs.Bytes
			m.update(func(p *MigrationProgress) {
				p.SlotsDone += len(moves)
				p.GroupsDone++
				p.Rows += rows
				p.BaseRows += st.BaseRows
				p.Bytes += bytes
				p.Version = t.Version
				p.MaxFenced = max(p.MaxFenced, fenced)
			})
			m.log.Info("slots moved", "from", moves[0].From, "to", moves[0].To, "slots", len(moves), "rows", rows, "bytes", bytes, "rounds", st.Rounds+hs.Rounds, "fenced", fenced, "version", t.Version)
			// The source no longer owns the slots once it has installed t; if it has not (it
			// failed meanwhile), it keeps them fenced until it does or is recovered.
			m.release(gctx, nodes, moves[0].From, id)
			return nil
		})
	}
	err := g.Wait()
	pubMu.Lock()
	last := published
	pubMu.Unlock()
	if err != nil {
		return last, fmt.Errorf("%w: %w", ErrMigration, err)
	}
	if len(failed) > 0 {
		return last, fmt.Errorf("%w: %d of %d groups: %w", ErrMigration, len(failed), len(groups), errors.Join(failed...))
	}
	if !last.SamePlacement(next) {
		return last, fmt.Errorf("%w: placement after the moves differs from the target", ErrMigration)
	}
	if slices.Equal(last.Nodes, next.Nodes) {
		return last, nil
	}
	final, err := last.WithMoves(last.Version+1, next.Nodes, nil)
	if err != nil {
		return last, err
	}
	resume, err := m.pauseSteps(ctx, nodes, last)
	if err != nil {
		return last, fmt.Errorf("%w: %w", ErrMigration, err)
	}
	err = publish(ctx, final)
	if err != nil && errors.Is(err, ErrNotPublished) {
		resume(last.Version)
		return last, fmt.Errorf("%w: publish owner table %d: %w", ErrMigration, final.Version, err)
	}
	resume(final.Version)
	if err != nil {
		return final, fmt.Errorf("%w: publish owner table %d: %w", ErrMigration, final.Version, err)
	}
	m.update(func(p *MigrationProgress) { p.Version = final.Version })
	return final, nil
}

// moveGroup runs one phase of migration id: the destination pulls the slots from the source.
func (m *Migrator) moveGroup(ctx context.Context, nodes []Node, moves []Move, id uint64, phase string) (MigrationStats, error) {
	from, to := moves[0].From, moves[0].To
	spec := MigrationSpec{
		Phase: phase, From: Node{ID: from, Addr: nodeAddr(nodes, from)}, MaxRounds: m.cfg.MaxRounds,
		SmallRound: m.cfg.SmallRound, ChunkBytes: m.cfg.ChunkBytes, Bandwidth: m.cfg.Bandwidth,
	}
	for _, mv := range moves {
		spec.Slots = append(spec.Slots, mv.Slot)
	}
	body, err := json.Marshal(spec)
	if err != nil {
		return MigrationStats{}, err
	}
	var st MigrationStats
	resp, err := m.rpc.Call(ctx, nodeAddr(nodes, to), methodMigrate, append(migHeader(opReceive, id), body...))
	if err != nil {
		// The destination may not have got the request, or may have died in it: make sure the
		// source is not left fenced.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if aerr := m.call(actx, spec.From.Addr, opAbort, id, nil); aerr != nil {
			m.log.Warn("could not lift the fence of a failed migration", "server", from, "err", aerr)
		}
		// And if it went on and finished, it must not keep rows of slots it does not own.
		if derr := m.call(actx, nodeAddr(nodes, to), opDiscard, id, appendSlots(nil, spec.Slots)); derr != nil {
			m.log.Warn("could not discard the slots of a failed migration", "server", to, "err", derr)
		}
		return st, fmt.Errorf("%s -> %s: %w", from, to, mapErr(nodeAddr(nodes, to), err))
	}
	err = json.Unmarshal(resp, &st)
	m.rpc.Release(resp)
	if err != nil {
		return st, fmt.Errorf("%w: migration stats from %s: %w", ErrCorrupt, to, err)
	}
	return st, nil
}

// release ends a published group on its source, which drops the slots' rows.
func (m *Migrator) release(ctx context.Context, nodes []Node, from string, id uint64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := m.call(ctx, nodeAddr(nodes, from), opRelease, id, nil); err != nil {
		m.log.Warn("source could not drop the moved slots", "server", from, "err", err)
	}
}

// callOff ends a group whose copy succeeded but whose table was not published: the source lifts
// its fence and keeps the slots, the destination forgets them.
func (m *Migrator) callOff(ctx context.Context, nodes []Node, moves []Move, id uint64) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	from, to := moves[0].From, moves[0].To
	if err := m.call(ctx, nodeAddr(nodes, from), opAbort, id, nil); err != nil {
		m.log.Warn("could not lift the fence of a called-off migration", "server", from, "err", err)
	}
	slots := make([]int, len(moves))
	for i, mv := range moves {
		slots[i] = mv.Slot
	}
	if err := m.call(ctx, nodeAddr(nodes, to), opDiscard, id, appendSlots(nil, slots)); err != nil {
		m.log.Warn("could not discard the slots of a called-off migration", "server", to, "err", err)
	}
	m.update(func(p *MigrationProgress) { p.GroupsFailed++ })
}

func migHeader(op byte, id uint64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{op}, id)
}

func (m *Migrator) call(ctx context.Context, addr string, op byte, id uint64, body []byte) error {
	resp, err := m.rpc.Call(ctx, addr, methodMigrate, append(migHeader(op, id), body...))
	if err != nil {
		return mapErr(addr, err)
	}
	m.rpc.Release(resp)
	return nil
}

// group splits moves into groups of one source and destination, at most GroupSlots each,
// ordered so that the groups of different pairs interleave.
func (m *Migrator) group(moves []Move) [][]Move {
	byPair := map[[2]string][]Move{}
	var pairs [][2]string
	for _, mv := range moves {
		k := [2]string{mv.From, mv.To}
		if byPair[k] == nil {
			pairs = append(pairs, k)
		}
		byPair[k] = append(byPair[k], mv)
	}
	sort.Slice(pairs, func(i, j int) bool {
		if pairs[i][0] != pairs[j][0] {
			return pairs[i][0] < pairs[j][0]
		}
		return pairs[i][1] < pairs[j][1]
	})
	var out [][]Move
	for more := true; more; {
		more = false
		for _, k := range pairs {
			mv := byPair[k]
			if len(mv) == 0 {
				continue
			}
			n := min(len(mv), m.cfg.GroupSlots)
			out = append(out, mv[:n])
			byPair[k] = mv[n:]
			more = more || len(mv) > n
		}
	}
	return out
}

// unionNodes returns the nodes of a and b, b's entry where both have one.
func unionNodes(a, b []Node) []Node {
	byID := map[string]Node{}
	for _, n := range a {
		byID[n.ID] = n
	}
	for _, n := range b {
		byID[n.ID] = n
	}
	out := make([]Node, 0, len(byID))
	for _, n := range byID {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func nodeAddr(nodes []Node, id string) string {
	for _, n := range nodes {
		if n.ID == id {
			return n.Addr
		}
	}
	return ""
}

// pauseSteps brings synchronous servers to a step boundary before the owner table changes (see
// Server holdSteps): every server of nodes holds the steps not yet begun, then those that cur's
// servers have begun are completed. The returned resume ends the hold on every server with the
// version of the newest table published. Asynchronous servers hold nothing, and a job whose
// reachable servers are all asynchronous is not held up by those it cannot reach.
func (m *Migrator) pauseSteps(ctx context.Context, nodes []Node, cur *OwnerTable) (resume func(floor uint64), err error) {
	answers := make([][]byte, len(nodes))
	errs := make([]error, len(nodes))
	var g errgroup.Group
	for i, n := range nodes {
		g.Go(func() error {
			resp, err := m.rpc.Call(ctx, n.Addr, methodMigrate, migHeader(opHold, 0))
			if err != nil {
				errs[i] = fmt.Errorf("hold the steps of %s: %w", n.ID, mapErr(n.Addr, err))
				return nil
			}
			answers[i] = append([]byte(nil), resp...)
			m.rpc.Release(resp)
			return nil
		})
	}
	g.Wait()
	err = errors.Join(errs...)
	// Each server's hold, by its generation (0: not held), and per table the highest step
	// begun by a server the workers push to (they push every step to every server of their
	// table).
	gens := make([]uint64, len(nodes))
	var boundary map[string]int64 // once every server reached it
	resume = func(floor uint64) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		var g errgroup.Group
		for i, n := range nodes {
			if gens[i] == 0 {
				continue
			}
			body := binary.LittleEndian.AppendUint64(nil, gens[i])
			body = appendSteps(binary.LittleEndian.AppendUint64(body, floor), boundary)
			g.Go(func() error {
				if err := m.call(rctx, n.Addr, opUnhold, 0, body); err != nil {
					m.log.Warn("could not end the hold of the synchronous steps; it ends by itself", "server", n.ID, "err", err)
				}
				return nil
			})
		}
		g.Wait()
	}
	inCur := map[string]bool{}
	for _, n := range cur.Nodes {
		inCur[n.ID] = true
	}
	begun := map[string]int64{}
	syncs := 0
	for i, n := range nodes {
		if errs[i] != nil {
			continue
		}
		a := answers[i]
		if len(a) == 1 && a[0] == 0 {
			continue // asynchronous
		}
		var steps map[string]int64
		if len(a) >= 9 && a[0] == 1 {
			gens[i] = binary.LittleEndian.Uint64(a[1:])
			steps, _ = decodeSteps(a[9:])
		}
		if steps == nil || gens[i] == 0 {
			resume(0)
			return nil, fmt.Errorf("%w: hold answer from %s", ErrCorrupt, n.ID)
		}
		syncs++
		for name, step := range steps {
			if v, ok := begun[name]; inCur[n.ID] && (!ok || step > v) {
				begun[name] = step
			}
		}
	}
	switch {
	case syncs == 0:
		return func(uint64) {}, nil
	case err != nil:
		resume(0)
		return nil, err
	case syncs < len(nodes):
		resume(0)
		return nil, fmt.Errorf("%w: %d of %d servers train synchronously", ErrBadConfig, syncs, len(nodes))
	}
	wctx, cancel := context.WithTimeout(ctx, m.cfg.StepWait)
	defer cancel()
	g = errgroup.Group{}
	for i, n := range nodes {
		body := binary.LittleEndian.AppendUint64(nil, gens[i])
		if inCur[n.ID] {
			body = appendSteps(body, begun)
		} else {
			body = appendSteps(body, nil) // its own steps only
		}
		g.Go(func() error {
			if err := m.call(wctx, n.Addr, opHoldAfter, 0, body); err != nil {
				return fmt.Errorf("bring %s to a step boundary: %w", n.ID, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		resume(0) // ends the holds, and with them the servers' waits
		return nil, err
	}
	boundary = begun
	return resume, nil
}
