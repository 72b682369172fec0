package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"
)

// RestoreOption varies one Verify, Load or Restore.
type RestoreOption func(*restoreOpts) error

type restoreOpts struct {
	slots       []int
	have        bool
	storageOnly bool
	blobs       func(node, name string) bool
}

// RestoreSlots declares the slots this node owns now (default: every slot); only their rows are loaded.
// The checkpoint may come from any number of nodes, even with another slot count: then every chunk is
// read and rows are placed by their id.
func RestoreSlots(slots []int) RestoreOption {
	return func(o *restoreOpts) error {
		o.slots, o.have = slots, true
		return nil
	}
}

// RestoreFromStorage ignores shared memory and reads everything from storage.
func RestoreFromStorage() RestoreOption {
	return func(o *restoreOpts) error {
		o.storageOnly = true
		return nil
	}
}

// RestoreBlobs selects the node blobs to return (default: all of them).
func RestoreBlobs(keep func(node, name string) bool) RestoreOption {
	return func(o *restoreOpts) error {
		o.blobs = keep
		return nil
	}
}

// Source says where a node's part of a checkpoint was read from.
type Source uint8

const (
	// SourceStorage means the chunks were read from Storage.
	SourceStorage Source = iota
	// SourceShm means the rows were read from a sealed shared-memory generation on this host.
	SourceShm
)

func (s Source) String() string {
	if s == SourceShm {
		return "shm"
	}
	return "storage"
}

// Restored reports a restore.
type Restored struct {
	Step    uint64
	Sources map[string]Source // by node of the checkpoint, for the nodes rows were read from
	Records map[string]int64  // by table: records applied
	Blobs   []NodeBlob
}

// NodeBlob is a blob saved by one node's snapshot.
type NodeBlob struct {
	Node string
	Blob
}

// restorePlan is a committed checkpoint resolved to its sources.
type restorePlan struct {
	rec     *commitRecord
	mine    slotSet // slots this node owns, in its own slot count
	reslot  bool    // the checkpoint has another slot count
	nodes   []*nodePlan
	readers []*region
	own     int // generation of this node's region used, or -1
	// bulk are the tables whose full base comes from shared memory group by group, each piece
	// checked just before it is loaded (see planBulk); verify leaves those pieces to apply.
	bulk []*bulkLoad
}

// bulkLoad is the load of one ShardedTable's base segment from one node's shared memory.
type bulkLoad struct {
	name  string
	np    *nodePlan
	tab   *segTable // the base segment's entry of the table
	data  []byte
	load  func(group int, src []byte) error
	end   func(keep bool) (int, error)
	ended bool
}

type nodePlan struct {
	node  string
	entry commitNode
	owned slotSet // the node's slots at the step
	// live[k] are the slots whose rows of chain element k (segs[k] or chain[k]) survive to the
	// step: owned in it and kept by every later element (see liveSets).
	live     []slotSet
	relevant bool
	src      Source
	// shared memory: the chain's segments and their bytes
	segs   []*segment
	tdata  [][][]byte // tdata[k][t]
	bdata  [][]byte   // blobs of the last segment
	ownGen int
	// storage: the manifest chain, base first
	chain []*manifest
}

func (o *restoreOpts) build(opts []RestoreOption) error {
	for _, opt := range opts {
		if err := opt(o); err != nil {
			return err
		}
	}
	return nil
}

// Verify checks that the committed checkpoint of step is complete and intact for this node — that
// every chunk or shared-memory range it would load has the right checksum — without changing any
// table. A coordinator restoring several nodes asks each to Verify a step and has all of them Load
// the newest step that every node verified (see Committer.Choose).
func (c *Checkpointer) Verify(ctx context.Context, step uint64, opts ...RestoreOption) error {
	var o restoreOpts
	if err := o.build(opts); err != nil {
		return err
	}
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	p, err := c.plan(ctx, step, &o)
	if err != nil {
		return err
	}
	defer p.close()
	return c.verify(ctx, p, &o)
}

// Load restores the committed checkpoint of step into the tables, which should be empty (rows the
// checkpoint does not hold are left as they are). A corrupt or incomplete checkpoint returns an
// error wrapping ErrCorrupt or ErrNotCommitted with the tables untouched: everything is verified
// first, but for the pieces of a bulk load from shared memory (see ShardedTable), each verified just
// before it is loaded, a failure undoing the whole load (then the snapshots in the pipeline have
// been abandoned already). An error while applying wraps ErrPartialRestore. After a Load the next
// snapshot is full.
//
// Before it changes the tables, Load abandons the snapshots taken earlier whose persists have not been
// reported: a persist in progress is cancelled and removes what it wrote, the others never start,
// WaitPersisted reports them as a *PersistError wrapping ErrAbandoned and OnPersist is not called.
// Results of snapshots after step are forgotten the same way, so a step taken again after the Load
// only ever yields its new manifest. Flush waits for abandoned persists to wind down.
func (c *Checkpointer) Load(ctx context.Context, step uint64, opts ...RestoreOption) (*Restored, error) {
	var o restoreOpts
	if err := o.build(opts); err != nil {
		return nil, err
	}
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	p, err := c.plan(ctx, step, &o)
	if err != nil {
		return nil, err
	}
	defer p.close()
	c.planBulk(p)
	if err := c.verify(ctx, p, &o); err != nil {
		return nil, err
	}
	r, err := c.apply(ctx, p, &o)
	if err == nil {
		c.verifyStorageLater(p, o)
	}
	return r, err
}

// verifyStorageLater checks in the background the storage copy of a commit restored (partly)
// from shared memory, whose storage chunks the restore did not read, and reports the result to
// OnStorageVerified and a corrupt copy to the log.
func (c *Checkpointer) verifyStorageLater(p *restorePlan, o restoreOpts) {
	shm := false
	for _, np := range p.nodes {
		shm = shm || (np.relevant && np.src == SourceShm)
	}
	if !shm {
		return
	}
	step := p.rec.Step
	o.storageOnly = true
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx := c.ctx
		sp, err := c.plan(ctx, step, &o)
		if err == nil {
			err = c.verify(ctx, sp, &o)
			sp.close()
		}
		if ctx.Err() != nil {
			return // closed: nothing was checked
		}
		if err != nil {
			c.log.Warn("checkpoint: the storage copy of the commit restored from shared memory is damaged; a restore on another host would skip it",
				"step", step, "err", err)
		}
		if c.cfg.OnStorageVerified != nil {
			c.cfg.OnStorageVerified(step, err)
		}
	}()
}

// Restore loads the newest committed checkpoint that verifies, skipping (and logging) corrupt,
// truncated or half-committed ones, and returns ErrNoCheckpoint if none does. Each node decides alone,
// so with several nodes use Committer.Choose with Verify and Load, which makes them agree on the step.
// Snapshots in the pipeline are abandoned as by Load.
func (c *Checkpointer) Restore(ctx context.Context, opts ...RestoreOption) (*Restored, error) {
	var o restoreOpts
	if err := o.build(opts); err != nil {
		return nil, err
	}
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	if c.isClosed() {
		return nil, ErrClosed
	}
	steps, err := commitSteps(ctx, c.cfg.Storage, c.cfg.Job)
	if err != nil {
		return nil, err
	}
	for _, step := range steps {
		p, err := c.plan(ctx, step, &o)
		if err == nil {
			c.planBulk(p)
			err = c.verify(ctx, p, &o)
			if err == nil {
				r, err := c.apply(ctx, p, &o)
				p.close()
				if err == nil {
					c.verifyStorageLater(p, o)
				}
				return r, err
			}
			p.close()
		}
		if !skippable(err) {
			return nil, err
		}
		c.log.Warn("checkpoint: skipping checkpoint", "step", step, "reason", err)
	}
	return nil, ErrNoCheckpoint
}

// skippable reports whether err means the checkpoint is unusable (as opposed to a failure to read it).
func skippable(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotCommitted) || errors.Is(err, ErrNotFound)
}

func (p *restorePlan) close() {
	p.cancelBulk()
	for _, r := range p.readers {
		r.close()
	}
}

// cancelBulk ends the bulk loads not yet ended, removing what they loaded, and forgets them.
func (p *restorePlan) cancelBulk() error {
	var err error
	for _, b := range p.bulk {
		if !b.ended {
			b.ended = true
			if _, e := b.end(false); e != nil {
				err = errors.Join(err, fmt.Errorf("table %s: %w", b.name, e))
			}
		}
	}
	p.bulk = nil
	return err
}

// bulkFor returns the bulk load of table ti of node np's segment k, or nil.
func (p *restorePlan) bulkFor(np *nodePlan, k int, name string) *bulkLoad {
	if k != 0 {
		return nil
	}
	for _, b := range p.bulk {
		if b.np == np && b.name == name {
			return b
		}
	}
	return nil
}

// planBulk picks the tables that Load loads group by group: when exactly one node's part is
// loaded, from shared memory, every row of it (no slot filter), a ShardedTable whose base segment
// records its groups, and the table accepts them (it is empty and partitions alike).
func (c *Checkpointer) planBulk(p *restorePlan) {
	var np *nodePlan
	for _, n := range p.nodes {
		if n.relevant {
			if np != nil {
				return
			}
			np = n
		}
	}
	if np == nil || np.src != SourceShm || p.keepFor(np, 0, 0, np.owned.n, true) != nil {
		return
	}
	base := np.segs[0]
	for _, nt := range c.tables {
		st, ok := nt.t.(ShardedTable)
		if !ok {
			continue
		}
		ti := base.tableIndex(nt.name)
		tab := &base.Tables[ti]
		if len(tab.Groups) == 0 || !tab.WholeRecords {
			continue
		}
		counts := make([]int, len(tab.Groups))
		for g, n := range tab.Groups {
			counts[g] = int(n)
		}
		load, end, err := st.LoadRawShards(tab.Key, counts)
		if err != nil {
			c.log.Debug("checkpoint: table restored record by record", "table", nt.name, "reason", err)
			continue
		}
		p.bulk = append(p.bulk, &bulkLoad{name: nt.name, np: np, tab: tab, data: np.tdata[0][ti], load: load, end: end})
	}
}

// plan reads the commit record of step and resolves each node to shared memory (a sealed generation on
// this host whose chain matches) or to its chain of manifests in storage.
func (c *Checkpointer) plan(ctx context.Context, step uint64, o *restoreOpts) (*restorePlan, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	S := c.cfg.Slots
	mine := allSlots(S)
	if o.have {
		var ok bool
		if mine, ok = slotSetFrom(S, o.slots); !ok {
			return nil, fmt.Errorf("checkpoint: restore slots outside [0,%d)", S)
		}
	}
	rec, err := readCommit(ctx, c.cfg.Storage, c.cfg.Job, step)
	if err != nil {
		return nil, err
	}
	p := &restorePlan{rec: rec, mine: mine, reslot: rec.Slots != S, own: -1}
	ok := false
	defer func() {
		if !ok {
			p.close()
		}
	}()
	for _, n := range rec.Nodes {
		np := &nodePlan{node: n.Node, entry: n, ownGen: -1}
		if !o.storageOnly {
			c.planShm(p, np, n)
		}
		if np.segs == nil {
			if err := c.planStorage(ctx, np, n, rec); err != nil {
				return nil, err
			}
		}
		if np.owned.n != rec.Slots {
			return nil, corruptf("node %s: slot set of %d, commit has %d slots", n.Node, np.owned.n, rec.Slots)
		}
		if err := c.checkTables(np); err != nil {
			return nil, err
		}
		np.relevant = p.reslot || np.owned.intersect(padTo(mine, rec.Slots)).count() > 0
		p.nodes = append(p.nodes, np)
	}
	ok = true
	return p, nil
}

// padTo returns s if it already has n slots, else an empty set of n slots (a slot count mismatch is
// handled by reslotting, where this set is not used).
func padTo(s slotSet, n int) slotSet {
	if s.n == n {
		return s
	}
	return newSlotSet(n)
}

// planShm looks for node n's chain in a sealed generation of its region on this host.
func (c *Checkpointer) planShm(p *restorePlan, np *nodePlan, n commitNode) {
	if n.Node == c.cfg.Node {
		c.mu.Lock()
		defer c.mu.Unlock()
		for gi, g := range c.reg.gens {
			if matchChain(g, n.Segments) {
				np.useShm(g, len(n.Segments))
				np.ownGen = gi
				return
			}
		}
		return
	}
	dir := filepath.Join(c.cfg.ShmDir, c.cfg.Job, n.Node)
	r, err := openRegion(dir, c.cfg.Job, n.Node, p.rec.Slots, false, c.log)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			c.log.Info("checkpoint: not using another node's shared memory", "region_of", n.Node, "err", err)
		}
		return
	}
	for _, g := range r.gens {
		if matchChain(g, n.Segments) {
			np.useShm(g, len(n.Segments))
			p.readers = append(p.readers, r)
			return
		}
	}
	r.close()
}

// matchChain reports whether g's sealed segments start with the chain ids.
func matchChain(g *generation, ids []uint64) bool {
	if g.sealed < len(ids) || len(ids) == 0 {
		return false
	}
	for i, id := range ids {
		if g.segs[i].ID != id {
			return false
		}
	}
	return true
}

func (np *nodePlan) useShm(g *generation, n int) {
	np.src = SourceShm
	np.segs = append([]*segment(nil), g.segs[:n]...)
	for _, s := range np.segs {
		var ts [][]byte
		for _, t := range s.Tables {
			ts = append(ts, g.data(t.Extent, t.Off, t.Len))
		}
		np.tdata = append(np.tdata, ts)
	}
	for _, b := range np.segs[n-1].Blobs {
		np.bdata = append(np.bdata, g.data(b.Extent, b.Off, b.Len))
	}
	np.owned = np.segs[n-1].Owned
	owned := make([]slotSet, n)
	for k, s := range np.segs {
		owned[k] = s.Owned
	}
	np.live = liveSets(owned, owned)
}

// liveSets returns, for the elements of a chain (oldest first) with the given owned and kept slots,
// the slots whose rows of each element survive to the last one: a row of element k survives if
// its slot is owned in k and kept by every later element. In shared memory an element is a
// snapshot, and it keeps the slots it owns; in storage it is a manifest (see manifest.Kept). So
// the rows of a slot a node lost are dropped without deletion records, and a slot lost and
// owned again comes back only through the later whole copy of its rows.
func liveSets(owned, kept []slotSet) []slotSet {
	out := make([]slotSet, len(owned))
	var acc slotSet // kept by every later element
	for k := len(owned) - 1; k >= 0; k-- {
		out[k] = owned[k]
		if k+1 < len(owned) {
			out[k] = out[k].intersect(acc)
			acc = acc.intersect(kept[k])
		} else {
			acc = kept[k]
		}
	}
	return out
}

// maxManifest bounds a manifest read whose size is not known in advance.
const maxManifest = 256 << 20

// maxChain bounds the deltas followed back to a base.
const maxChain = 100000

// planStorage reads node n's manifest and its parents back to the full base.
func (c *Checkpointer) planStorage(ctx context.Context, np *nodePlan, n commitNode, rec *commitRecord) error {
	return planStorage(ctx, c.cfg.Storage, np, n, rec)
}

// planStorage reads node n's manifest of the commit rec from st, and its parents back to the
// full base, into np.
func planStorage(ctx context.Context, st Storage, np *nodePlan, n commitNode, rec *commitRecord) error {
	np.src = SourceStorage
	b, err := getObject(ctx, st, n.Manifest, nil, int64(n.Size), 0)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Node, err)
	}
	if xxhashSum(b) != n.Sum {
		return corruptf("node %s: manifest %s does not match the commit record", n.Node, n.Manifest)
	}
	m, err := decodeManifest(b)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Node, err)
	}
	if m.Job != rec.Job || m.Node != n.Node || m.Step != rec.Step || !slices.Equal(m.Segments, n.Segments) {
		return corruptf("node %s: manifest %s is for another checkpoint", n.Node, n.Manifest)
	}
	chain := []*manifest{m}
	for cur := m; !cur.Full; {
		if len(chain) > maxChain {
			return corruptf("node %s: delta chain longer than %d", n.Node, maxChain)
		}
		b, err := getObject(ctx, st, cur.Parent, nil, -1, maxManifest)
		if err != nil {
			return fmt.Errorf("node %s: parent of step %d: %w", n.Node, cur.Step, err)
		}
		pm, err := decodeManifest(b)
		if err != nil {
			return fmt.Errorf("node %s: parent of step %d: %w", n.Node, cur.Step, err)
		}
		if pm.Job != m.Job || pm.Node != m.Node || pm.Step != cur.ParentStep || pm.BaseStep != m.BaseStep || pm.Slots != m.Slots {
			return corruptf("node %s: parent %s does not continue the chain", n.Node, cur.Parent)
		}
		chain = append(chain, pm)
		cur = pm
	}
	slices.Reverse(chain)
	owned, kept := make([]slotSet, len(chain)), make([]slotSet, len(chain))
	for k, cm := range chain {
		if cm.Owned.n != m.Slots {
			return corruptf("node %s: manifest of step %d has %d slots, not %d", n.Node, cm.Step, cm.Owned.n, m.Slots)
		}
		owned[k], kept[k] = cm.Owned, cm.Kept
	}
	np.chain = chain
	np.owned = m.Owned
	np.live = liveSets(owned, kept)
	return nil
}

// checkTables checks that the node's checkpoint holds exactly this Checkpointer's tables, with equal
// schemas, in every element of its chain.
func (c *Checkpointer) checkTables(np *nodePlan) error {
	var sets [][]string
	var schemas []map[string][]byte
	add := func(names []string, schema map[string][]byte) {
		sets = append(sets, names)
		schemas = append(schemas, schema)
	}
	for _, s := range np.segs {
		names, sch := []string{}, map[string][]byte{}
		for _, t := range s.Tables {
			names = append(names, t.Name)
			sch[t.Name] = t.Schema
		}
		add(names, sch)
	}
	for _, m := range np.chain {
		names, sch := []string{}, map[string][]byte{}
		for _, t := range m.Tables {
			names = append(names, t.Name)
			sch[t.Name] = t.Schema
		}
		add(names, sch)
	}
	want := make([]string, len(c.tables))
	for i, nt := range c.tables {
		want[i] = nt.name
	}
	for i, names := range sets {
		sort.Strings(names)
		if !slices.Equal(names, want) {
			return fmt.Errorf("%w: node %s saved tables [%s], this node has [%s]", ErrTableSet, np.node,
				strings.Join(names, " "), strings.Join(want, " "))
		}
		for _, nt := range c.tables {
			if !bytes.Equal(schemas[i][nt.name], nt.t.Schema()) {
				return fmt.Errorf("%w: table %s of node %s", ErrSchemaMismatch, nt.name, np.node)
			}
		}
	}
	return nil
}

// chunkNeeded reports whether a chunk of element k of node np's chain over slots [lo, hi) may hold
// rows this node needs.
func (p *restorePlan) chunkNeeded(np *nodePlan, k int, lo, hi uint32) bool {
	live := np.live[k]
	for s := int(lo); s < int(hi); s++ {
		if live.has(s) && (p.reslot || p.mine.has(s)) {
			return true
		}
	}
	return false
}

// keepFor returns the filter for the rows of element k of node np's chain (a segment in shared
// memory, which may hold rows of any slot; or in storage a chunk over slots [lo, hi), whose rows
// are of slots its manifest owns): nil when every row there is wanted. A row is wanted when its
// slot survives to the step (np.live[k]) and this node owns it now.
func (p *restorePlan) keepFor(np *nodePlan, k, lo, hi int, fromShm bool) func(uint64) bool {
	newS, oldS := p.mine.n, np.owned.n
	live := np.live[k]
	var held slotSet // the slots whose rows element k may hold
	if fromShm {
		held = allSlots(oldS)
	} else {
		held = np.chain[k].Owned
	}
	dropsOld := !held.subsetOf(live) // some rows of the element did not survive
	switch {
	case p.reslot:
		if !dropsOld {
			return func(id uint64) bool { return p.mine.has(slotOf(id, newS)) }
		}
		return func(id uint64) bool {
			h := hashID(id)
			return live.has(hashSlot(h, oldS)) && p.mine.has(hashSlot(h, newS))
		}
	case fromShm:
		if !dropsOld && p.mine.full() {
			return nil
		}
		return func(id uint64) bool {
			s := slotOf(id, oldS)
			return live.has(s) && p.mine.has(s)
		}
	default:
		for s := lo; s < hi; s++ {
			if held.has(s) && !(live.has(s) && p.mine.has(s)) {
				return func(id uint64) bool {
					s := slotOf(id, oldS)
					return live.has(s) && p.mine.has(s)
				}
			}
		}
		return nil
	}
}

// verify checks every checksum of what apply will read, without decompressing, except the pieces
// of bulk loads, which apply checks as it loads them. A node whose shared memory fails its
// checksums falls back to storage.
func (c *Checkpointer) verify(ctx context.Context, p *restorePlan, o *restoreOpts) error {
	for _, np := range p.nodes {
		if np.src != SourceShm {
			continue
		}
		err := c.verifyShm(ctx, p, np, o)
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrCorrupt) {
			return err
		}
		c.log.Warn("checkpoint: shared memory failed its checksums; reading storage instead", "region_of", np.node, "err", err)
		if err := p.cancelBulk(); err != nil {
			return err
		}
		if err := c.toStorage(ctx, p, np); err != nil {
			return err
		}
	}
	p.setOwn()
	return c.verifyStorage(ctx, p, o)
}

// toStorage plans node np's part from storage instead of shared memory.
func (c *Checkpointer) toStorage(ctx context.Context, p *restorePlan, np *nodePlan) error {
	*np = nodePlan{node: np.node, entry: np.entry, relevant: np.relevant, ownGen: -1}
	if err := c.planStorage(ctx, np, np.entry, p.rec); err != nil {
		return err
	}
	return c.checkTables(np)
}

// setOwn records the generation of this node's own region the plan reads, if any.
func (p *restorePlan) setOwn() {
	p.own = -1
	for _, np := range p.nodes {
		if np.ownGen >= 0 {
			p.own = np.ownGen
		}
	}
}

// verifyStorage checks the chunks and blobs that apply will read from storage.
func (c *Checkpointer) verifyStorage(ctx context.Context, p *restorePlan, o *restoreOpts) error {
	eg, ctx := errgroup.WithContext(ctx)
	eg.SetLimit(c.cfg.Workers)
	for _, np := range p.nodes {
		if np.src == SourceShm {
			continue
		}
		for k, m := range np.chain {
			if !np.relevant {
				break
			}
			for _, t := range m.Tables {
				for _, ch := range t.Chunks {
					if !p.chunkNeeded(np, k, ch.SlotLo, ch.SlotHi) {
						continue
					}
					name := m.dir() + "/" + ch.Object
					eg.Go(func() error { return c.checkObject(ctx, name, ch.Size, ch.Sum) })
				}
			}
		}
		last := np.chain[len(np.chain)-1]
		for _, b := range last.Blobs {
			if o.blobs == nil || o.blobs(np.node, b.Name) {
				name := last.dir() + "/" + b.Object
				eg.Go(func() error { return c.checkObject(ctx, name, b.Size, b.Sum) })
			}
		}
	}
	return eg.Wait()
}

// verifyShm checks the piece checksums of a node's shared-memory chain, but for the pieces of
// the plan's bulk loads.
func (c *Checkpointer) verifyShm(ctx context.Context, p *restorePlan, np *nodePlan, o *restoreOpts) error {
	eg, ctx := errgroup.WithContext(ctx)
	eg.SetLimit(c.cfg.Workers)
	for k, s := range np.segs {
		if !np.relevant {
			break
		}
		for ti, t := range s.Tables {
			if p.bulkFor(np, k, t.Name) != nil {
				continue
			}
			data := np.tdata[k][ti]
			for pi, sp := range t.spans(sealPiece) {
				want := t.Sums[pi]
				eg.Go(func() error {
					if err := ctx.Err(); err != nil {
						return err
					}
					if xxhashSum(data[sp.lo:sp.hi]) != want {
						return corruptf("node %s: shared memory of table %s at step %d, piece %d", np.node, t.Name, s.Step, pi)
					}
					return nil
				})
			}
		}
	}
	last := np.segs[len(np.segs)-1]
	for bi, b := range last.Blobs {
		if (o.blobs == nil || o.blobs(np.node, b.Name)) && xxhashSum(np.bdata[bi]) != b.Sum {
			eg.Go(func() error { return corruptf("node %s: shared memory of blob %s", np.node, b.Name) })
		}
	}
	return eg.Wait()
}

// checkObject reads a chunk object and checks its framing and checksum against the manifest's.
func (c *Checkpointer) checkObject(ctx context.Context, name string, size, sum uint64) error {
	buf := getBuf(int(size) + 1)
	defer putBuf(buf)
	b, err := getObject(ctx, c.cfg.Storage, name, (*buf)[:0], int64(size), 0)
	if err != nil {
		return err
	}
	*buf = b[:0]
	if _, _, err := checkChunk(b); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if chunkSum(b) != sum {
		return corruptf("%s: checksum differs from the manifest", name)
	}
	return nil
}

// decoded is one chunk read and decompressed for apply.
type decoded struct {
	raw  *[]byte
	file *[]byte
	rows []byte
}

// release returns d's buffers to the pool.
func (d decoded) release() {
	putBuf(d.file)
	putBuf(d.raw)
}

// readRows reads chunk ch of manifest m from st, checks it against the manifest (its checksum,
// and a header of rows of rowSize bytes over its slots) and decodes its records, into buffers
// of the pool that release returns.
func readRows(ctx context.Context, st Storage, m *manifest, ch chunkRef, rowSize uint32, cs *codecs) (decoded, error) {
	name := m.dir() + "/" + ch.Object
	file := getBuf(int(ch.Size) + 1)
	b, err := getObject(ctx, st, name, (*file)[:0], int64(ch.Size), 0)
	if err != nil {
		putBuf(file)
		return decoded{}, err
	}
	*file = b[:0]
	if chunkSum(b) != ch.Sum {
		putBuf(file)
		return decoded{}, corruptf("%s: checksum differs from the manifest", name)
	}
	raw := getBuf(int(ch.RawLen))
	ci, rows, err := decodeChunk(b, (*raw)[:0], int(ch.RawLen), cs)
	if err == nil && (ci.kind != chunkKindRows || ci.rowSize != rowSize || ci.slotLo != ch.SlotLo ||
		ci.slotHi != ch.SlotHi || ci.records != ch.Records) {
		err = corruptf("%s: header does not match the manifest", name)
	}
	if err != nil {
		putBuf(file)
		putBuf(raw)
		return decoded{}, fmt.Errorf("%s: %w", name, err)
	}
	*raw = rows[:0]
	return decoded{raw: raw, file: file, rows: rows}, nil
}

// apply loads the verified plan into the tables. Snapshots taken before describe tables that are about
// to be replaced, so it first abandons those whose persists have not been reported.
func (c *Checkpointer) apply(ctx context.Context, p *restorePlan, o *restoreOpts) (*Restored, error) {
	c.abandonPipeline(p.rec.Step)
	res := &Restored{Step: p.rec.Step, Sources: map[string]Source{}, Records: map[string]int64{}}
	partial := func(err error) (*Restored, error) {
		return nil, fmt.Errorf("%w: %w", ErrPartialRestore, err)
	}
	var bulkNode *nodePlan
	if len(p.bulk) > 0 {
		bulkNode = p.bulk[0].np
	}
	bulk, err := c.applyBulk(ctx, p)
	if errors.Is(err, ErrPartialRestore) {
		return nil, err
	}
	if errors.Is(err, ErrCorrupt) {
		// A piece failed its checksum as it was about to be loaded; every table is as it was.
		np := bulkNode
		c.log.Warn("checkpoint: shared memory failed its checksums; reading storage instead", "region_of", np.node, "err", err)
		if err := c.toStorage(ctx, p, np); err != nil {
			return nil, err
		}
		p.setOwn()
		if err := c.verifyStorage(ctx, p, o); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	for _, nt := range c.tables {
		n := bulk[nt.name]
		for _, np := range p.nodes {
			if !np.relevant {
				continue
			}
			res.Sources[np.node] = np.src
			if np.src == SourceShm {
				for k, s := range np.segs {
					if p.bulkFor(np, k, nt.name) != nil {
						continue
					}
					keep := p.keepFor(np, k, 0, np.owned.n, true)
					applied, err := nt.t.LoadRaw(np.tdata[k][s.tableIndex(nt.name)], keep)
					if err != nil {
						return partial(fmt.Errorf("table %s from shared memory of node %s: %w", nt.name, np.node, err))
					}
					n += int64(applied)
				}
				continue
			}
			type item struct {
				k  int
				m  *manifest
				ch chunkRef
			}
			var items []item
			for k, m := range np.chain {
				mt := m.table(nt.name)
				for _, ch := range mt.Chunks {
					if p.chunkNeeded(np, k, ch.SlotLo, ch.SlotHi) {
						items = append(items, item{k, m, ch})
					}
				}
			}
			rowSize := uint32(nt.t.RawRowSize())
			err := pipeline(ctx, len(items), c.cfg.Workers, func(ctx context.Context, i int) (decoded, error) {
				return readRows(ctx, c.cfg.Storage, items[i].m, items[i].ch, rowSize, c.cs)
			}, func(i int, d decoded) error {
				it := items[i]
				applied, err := nt.t.LoadRaw(d.rows, p.keepFor(np, it.k, int(it.ch.SlotLo), int(it.ch.SlotHi), false))
				n += int64(applied)
				return err
			}, decoded.release)
			if err != nil {
				return partial(fmt.Errorf("table %s from node %s: %w", nt.name, np.node, err))
			}
		}
		res.Records[nt.name] = n
	}
	for _, np := range p.nodes {
		blobs, err := c.readBlobs(ctx, np, o)
		if err != nil {
			return partial(err)
		}
		res.Blobs = append(res.Blobs, blobs...)
	}
	c.mu.Lock()
	c.haveStep, c.lastStep = true, p.rec.Step
	if p.own >= 0 {
		c.cur = p.own // keep the generation restored from until a newer chain is complete elsewhere
	}
	c.mu.Unlock()
	return res, nil
}

// applyBulk runs the plan's bulk loads: every group of every such table is a task, and a worker
// checks each piece of a group's records just before it loads it. It returns the records loaded by
// table. If any piece fails its checksum (ErrCorrupt) or any load fails, it removes every row the
// bulk loads added, so every table is as it was; only when that fails too is the error an
// ErrPartialRestore.
func (c *Checkpointer) applyBulk(ctx context.Context, p *restorePlan) (map[string]int64, error) {
	out := map[string]int64{}
	if len(p.bulk) == 0 {
		return out, nil
	}
	eg, ectx := errgroup.WithContext(ctx)
	eg.SetLimit(c.cfg.Workers)
	for _, b := range p.bulk {
		spans := b.tab.spans(sealPiece)
		for g, r := range b.tab.groupSpans(spans) {
			eg.Go(func() error {
				for k := r[0]; k < r[1]; k++ {
					if err := ectx.Err(); err != nil {
						return err
					}
					piece := b.data[spans[k].lo:spans[k].hi]
					if xxhashSum(piece) != b.tab.Sums[k] {
						return corruptf("node %s: shared memory of table %s at step %d, piece %d",
							b.np.node, b.name, b.np.segs[0].Step, k)
					}
					if err := b.load(g, piece); err != nil {
						return fmt.Errorf("table %s from shared memory of node %s: %w", b.name, b.np.node, err)
					}
				}
				return nil
			})
		}
	}
	if err := eg.Wait(); err != nil {
		if aerr := p.cancelBulk(); aerr != nil {
			return nil, fmt.Errorf("%w: %w; undoing the loads: %w", ErrPartialRestore, err, aerr)
		}
		return nil, err
	}
	for _, b := range p.bulk {
		b.ended = true
		n, err := b.end(true)
		if err != nil {
			return nil, fmt.Errorf("%w: table %s from shared memory of node %s: %w", ErrPartialRestore, b.name, b.np.node, err)
		}
		out[b.name] = int64(n)
	}
	return out, nil
}

// readBlobs returns the selected blobs of node np.
func (c *Checkpointer) readBlobs(ctx context.Context, np *nodePlan, o *restoreOpts) ([]NodeBlob, error) {
	var out []NodeBlob
	if np.src == SourceShm {
		for bi, b := range np.segs[len(np.segs)-1].Blobs {
			if o.blobs == nil || o.blobs(np.node, b.Name) {
				out = append(out, NodeBlob{np.node, Blob{b.Name, append([]byte(nil), np.bdata[bi]...)}})
			}
		}
		return out, nil
	}
	last := np.chain[len(np.chain)-1]
	for _, b := range last.Blobs {
		if o.blobs != nil && !o.blobs(np.node, b.Name) {
			continue
		}
		data, err := readBlob(ctx, c.cfg.Storage, last.dir()+"/"+b.Object, b, c.cs)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", np.node, err)
		}
		out = append(out, NodeBlob{np.node, Blob{b.Name, data}})
	}
	return out, nil
}

// readBlob reads and decodes one blob object.
func readBlob(ctx context.Context, st Storage, name string, b blobRef, cs *codecs) ([]byte, error) {
	file, err := getObject(ctx, st, name, nil, int64(b.Size), 0)
	if err != nil {
		return nil, err
	}
	if chunkSum(file) != b.Sum {
		return nil, corruptf("%s: checksum differs from its reference", name)
	}
	ci, data, err := decodeChunk(file, nil, int(b.RawLen), cs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if ci.kind != chunkKindBlob || ci.rawLen != b.RawLen {
		return nil, corruptf("%s: not the expected blob", name)
	}
	return data, nil
}

// commitSteps lists the steps that have a commit record, newest first.
func commitSteps(ctx context.Context, st Storage, job string) ([]uint64, error) {
	names, err := st.List(ctx, commitsPrefix(job))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list commits: %w", err)
	}
	var steps []uint64
	for _, n := range names {
		if s, ok := parseStep(strings.TrimPrefix(n, commitsPrefix(job))); ok {
			steps = append(steps, s)
		}
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i] > steps[j] })
	return steps, nil
}

// maxCommitRecord bounds a commit record read.
const maxCommitRecord = 64 << 20

// readCommit reads and checks the commit record of step.
func readCommit(ctx context.Context, st Storage, job string, step uint64) (*commitRecord, error) {
	b, err := getObject(ctx, st, commitName(job, step), nil, -1, maxCommitRecord)
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%w: step %d", ErrNotCommitted, step)
	}
	if err != nil {
		return nil, err
	}
	rec, err := decodeCommit(b)
	if err != nil {
		return nil, fmt.Errorf("commit of step %d: %w", step, err)
	}
	if rec.Job != job || rec.Step != step {
		return nil, corruptf("commit record %s is for job %q step %d", commitName(job, step), rec.Job, rec.Step)
	}
	return rec, nil
}
