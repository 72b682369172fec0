package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"
)

// SnapshotOption varies one Snapshot.
type SnapshotOption func(*snapOpts) error

type snapOpts struct {
	slots []int
	have  bool
	blobs []Blob
	full  bool
}

// Blob is an opaque named byte string saved with a checkpoint: dense parameters, the data-shard
// dispatcher's snapshot, the coordinator's state.
type Blob struct {
	Name string // 1-128 letters, digits, '.', '_' or '-'
	Data []byte
}

// SnapshotSlots declares the slots this node owns at this snapshot (default: every slot). Rows of
// other slots that the tables still hold are not persisted, and restore takes each slot from the node
// that owned it. A snapshot whose slots differ from the previous snapshot's is a delta when every
// table is a SlotDeltaTable: it holds the changed rows of the slots kept and every row of the slots
// gained, and records the slots, so that restore drops the rows of slots lost (see Snapshot);
// with a plain Table it is taken in full.
func SnapshotSlots(slots []int) SnapshotOption {
	return func(o *snapOpts) error {
		o.slots, o.have = slots, true
		return nil
	}
}

// SnapshotBlob saves data under name with the snapshot. Snapshot copies data before returning.
func SnapshotBlob(name string, data []byte) SnapshotOption {
	return func(o *snapOpts) error {
		if !validIdent(name) {
			return fmt.Errorf("checkpoint: blob name %q: want 1-128 letters, digits, '.', '_' or '-'", name)
		}
		for _, b := range o.blobs {
			if b.Name == name {
				return fmt.Errorf("checkpoint: blob %q given twice", name)
			}
		}
		o.blobs = append(o.blobs, Blob{name, data})
		return nil
	}
}

// SnapshotFull takes a full snapshot even if a delta is due.
func SnapshotFull() SnapshotOption {
	return func(o *snapOpts) error {
		o.full = true
		return nil
	}
}

// Snapshot copies the tables' rows into shared memory — every row for a full snapshot, only rows
// changed since the previous snapshot for a delta — and returns; the copy is all the caller waits for.
// Sealing (checksums) and persisting to storage follow in the background; WaitPersisted reports the
// outcome. For a consistent checkpoint call it at a step barrier; otherwise each row is consistent.
//
// When the slots differ from the previous snapshot's (SnapshotSlots), a delta costs about the
// rows of the slots gained on top of an ordinary delta: their rows are new to this node's chain
// and are copied whole. The rows of slots lost cost nothing: a restore keeps a row of a snapshot
// only if its slot is owned at every later snapshot of the chain, so a slot lost and owned again
// comes back only through the whole copy taken when it was gained again.
//
// Steps must increase, except that after a Load or Restore of step R the next step need only exceed R.
// A step taken again after such a rollback is a new snapshot: WaitPersisted and OnPersist report its
// own persist, never the abandoned one's. ErrBusy means the generation a full snapshot needs is still
// being persisted (or, just after a Load, that an abandoned persist is still winding down); nothing
// was copied and the next snapshot may try again. After any other error the next snapshot is
// taken in full, as the tables' change sets may already have been cleared.
func (c *Checkpointer) Snapshot(ctx context.Context, step uint64, opts ...SnapshotOption) (SnapshotInfo, error) {
	var o snapOpts
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return SnapshotInfo{}, err
		}
	}
	owned := allSlots(c.cfg.Slots)
	if o.have {
		var ok bool
		if owned, ok = slotSetFrom(c.cfg.Slots, o.slots); !ok {
			return SnapshotInfo{}, fmt.Errorf("checkpoint: snapshot slots outside [0,%d)", c.cfg.Slots)
		}
	}
	if err := ctx.Err(); err != nil {
		return SnapshotInfo{}, err
	}
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	info, err := c.snapshot(step, owned, o)
	c.mu.Lock()
	if err != nil && !errors.Is(err, ErrBusy) && !errors.Is(err, ErrStepOrder) && !errors.Is(err, ErrClosed) {
		c.needFull = true
		c.stats.SnapshotErrors++
	} else if err == nil {
		c.stats.Snapshots++
		c.stats.LastBlocked = info.Blocked
	}
	c.mu.Unlock()
	return info, err
}

func (c *Checkpointer) snapshot(step uint64, owned slotSet, o snapOpts) (SnapshotInfo, error) {
	start := time.Now()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return SnapshotInfo{}, ErrClosed
	}
	if c.haveStep && step <= c.lastStep {
		c.mu.Unlock()
		return SnapshotInfo{}, fmt.Errorf("%w: %d after %d", ErrStepOrder, step, c.lastStep)
	}
	// A change of slots is a delta when every table can copy by slot (and the chain has a slot
	// set to compare with); else it starts a new base.
	moved := !owned.equal(c.chainOwned)
	full := o.full || c.needFull || c.cur < 0 || c.sinceBase+1 >= c.cfg.FullEvery ||
		(moved && (!c.slotDeltas || c.chainOwned.n != owned.n))
	sel := deltaSel{owned: owned, gained: newSlotSet(owned.n)}
	if !full && moved {
		sel.gained = owned.minus(c.chainOwned)
	}
	gi := c.cur
	if full {
		gi = 0
		if c.cur >= 0 {
			gi = 1 - c.cur
		}
	}
	g := c.reg.gens[gi]
	if pending := g.pending; full && pending > 0 {
		c.mu.Unlock()
		return SnapshotInfo{}, fmt.Errorf("%w: generation %d has %d stages in flight", ErrBusy, gi, pending)
	}
	seg := &segment{ID: c.newIDLocked(), Step: step, Full: full, Owned: owned}
	if full {
		seg.BaseStep = step
	} else {
		seg.BaseStep = g.segs[0].Step
	}
	saved := make([]int64, len(g.extents))
	for i, x := range g.extents {
		saved[i] = x.used
	}
	if full {
		g.reset()
	}
	chain := g.chain
	c.mu.Unlock()

	if full {
		if err := c.reg.removeSeal(gi); err != nil {
			return SnapshotInfo{}, fmt.Errorf("checkpoint: unseal generation %d: %w", gi, err)
		}
	}
	c.cfg.Gate.enter()
	bytes, need, err := c.copyInto(g, gi, seg, !full, sel, o.blobs)
	c.cfg.Gate.leave()
	if err != nil {
		c.mu.Lock()
		for i, u := range saved {
			if !full {
				g.extents[i].used = u
			}
		}
		c.mu.Unlock()
		return SnapshotInfo{}, err
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	g.segs = append(g.segs, seg)
	c.cur = gi
	c.needFull = false
	if full {
		c.sinceBase = 0
		c.lastFull = need
	} else {
		c.sinceBase++
		c.maxDelta = max(c.maxDelta, need)
	}
	c.chainOwned = owned
	c.haveStep, c.lastStep = true, step
	// A result already kept for this step is of a snapshot a Load or Restore abandoned (steps
	// increase otherwise): this snapshot's own waiter replaces it.
	w := &persistWait{done: make(chan struct{})}
	if _, ok := c.results[step]; ok {
		c.resultOrder = slices.DeleteFunc(c.resultOrder, func(s uint64) bool { return s == step })
	}
	c.resultOrder = append(c.resultOrder, step)
	c.results[step] = w
	c.trimResultsLocked()
	g.pending += 2
	c.addWorkLocked(2)
	c.sealQ.push(stageJob{gen: g, chain: chain, idx: len(g.segs) - 1, step: step, epoch: c.epoch, wait: w})
	return SnapshotInfo{Step: step, Full: full, BaseStep: seg.BaseStep, Generation: gi, Bytes: bytes,
		Blocked: time.Since(start)}, nil
}

// trimResultsLocked forgets the oldest finished results beyond maxResults.
func (c *Checkpointer) trimResultsLocked() {
	for len(c.resultOrder) > maxResults {
		w := c.results[c.resultOrder[0]]
		select {
		case <-w.done:
		default:
			return
		}
		delete(c.results, c.resultOrder[0])
		c.resultOrder = c.resultOrder[1:]
	}
}

// deltaSel is what a delta of SlotDeltaTables copies: the changes of the slots owned, and every
// row of the slots gained since the previous snapshot.
type deltaSel struct {
	owned, gained slotSet
}

// copyPlan is how copyInto copies one table: through CopyRawDelta with these filters
// (slotted), or through CopyRaw or CopyRawShards.
type copyPlan struct {
	slotted        bool
	changed, whole func(uint64) bool
}

// planCopy decides how a snapshot copies table t. A delta of a SlotDeltaTable whose node does not
// own every slot, or gained some, goes through CopyRawDelta: changes of slots not owned are left
// out (restore would drop them; after a slot moves away they are mostly deletion records of its
// every row), and the slots gained are copied whole.
func planCopy(t Table, changedOnly bool, sel deltaSel) copyPlan {
	_, ok := t.(SlotDeltaTable)
	ng := sel.gained.count()
	if !changedOnly || !ok || (sel.owned.full() && ng == 0) {
		return copyPlan{}
	}
	p := copyPlan{slotted: true}
	if !sel.owned.full() {
		p.changed = sel.owned.hasID
	}
	if ng > 0 {
		p.whole = sel.gained.hasID
	}
	return p
}

// copyInto copies every table (and the blobs) into generation g and fills seg's ranges. It returns the
// bytes copied and the space the snapshot needed: the rooms of the copies placed ahead, and the
// room the others took.
//
// Every table whose copy has a bound — all but the slotted copies of slots gained — gets its room
// in one allocation made before any copy starts, and those tables are copied at once, up to
// Workers at a time, each by its own parallel copy: one fan-out for the snapshot, so that a
// goroutine descheduled mid-copy holds up only its own table while the other workers go on with
// the next (a table after table copy waited for the slowest goroutine of every table, about forty
// times a snapshot for a server of the dlrm example). Rooms are whole bounds, so the gaps a table
// leaves below its bound stay unused until the generation's next chain. A table whose room fell
// short (rows added since its bound, outside a barrier) and the unbounded ones are then copied
// one after another into the room they need.
func (c *Checkpointer) copyInto(g *generation, gi int, seg *segment, changedOnly bool, sel deltaSel, blobs []Blob) (bytes, need int64, err error) {
	// Make sure one extent can take the bounded copies and the blobs, so the copies below do not
	// allocate. A slotted copy is placed ahead only if its bound fits in what is free then: its
	// bound (RawSize) counts the deletion records it leaves out, and nothing bounds the rows of the
	// slots gained short of a pass over the table.
	plans := make([]copyPlan, len(c.tables))
	rooms := make([]int64, len(c.tables)) // > 0: placed ahead
	var plain, blobNeed int64
	for i, nt := range c.tables {
		plans[i] = planCopy(nt.t, changedOnly, sel)
		if !plans[i].slotted {
			rooms[i] = alignUp(copySpace(nt.t.RawSize(changedOnly), nt.t.RawRowSize()))
			plain += rooms[i]
		}
	}
	for _, b := range blobs {
		blobNeed += alignUp(int64(len(b.Data)))
	}
	need = plain + blobNeed
	if err := c.ensureFree(g, gi, need); err != nil {
		return 0, 0, err
	}
	c.mu.Lock()
	free := g.largestFree()
	c.mu.Unlock()
	ahead := plain
	for i, nt := range c.tables {
		if plans[i].slotted && plans[i].whole == nil {
			if r := alignUp(copySpace(nt.t.RawSize(true), nt.t.RawRowSize())); ahead+r+blobNeed <= free {
				rooms[i], ahead = r, ahead+r
			}
		}
	}

	done := make([]segTable, len(c.tables))
	copied := make([]bool, len(c.tables))
	short := make([]int, len(c.tables)) // the room a slotted copy placed ahead reported it needs
	if ahead > 0 {
		ext, off, dst, err := c.alloc(g, gi, ahead)
		if err != nil {
			return 0, 0, err
		}
		var eg errgroup.Group
		eg.SetLimit(c.cfg.Workers)
		ends := make([]int64, len(c.tables))
		var o int64
		for i, nt := range c.tables {
			if rooms[i] == 0 {
				continue
			}
			part, at := dst[o:o+rooms[i]:o+rooms[i]], o
			eg.Go(func() error {
				n, counts, key, err := copyTable(nt, plans[i], changedOnly, part)
				if errors.Is(err, io.ErrShortBuffer) {
					short[i] = n
					return nil // copied on its own below
				}
				if err != nil {
					return fmt.Errorf("checkpoint: copy table %s: %w", nt.name, err)
				}
				st, err := tableRecord(nt, ext, off+at, n, counts, key, len(part))
				if err != nil {
					return err
				}
				done[i], copied[i], ends[i] = st, true, at+int64(n)
				return nil
			})
			o += rooms[i]
		}
		if err := eg.Wait(); err != nil {
			return 0, 0, err
		}
		used := off
		for i := range c.tables {
			if copied[i] {
				used = max(used, alignUp(off+ends[i]))
			}
		}
		c.mu.Lock()
		g.extents[ext].used = used
		c.mu.Unlock()
	}
	for i, nt := range c.tables {
		if !copied[i] {
			st, err := c.copyAlone(g, gi, nt, plans[i], changedOnly, short[i])
			if err != nil {
				return 0, 0, err
			}
			done[i] = st
		}
	}
	for i, st := range done {
		seg.Tables = append(seg.Tables, st)
		bytes += int64(st.Len)
		switch {
		case plans[i].slotted && copied[i]:
			need += rooms[i] // the next delta is placed ahead by the same bound
		case plans[i].slotted:
			need += alignUp(copySpace(int(st.Len), int(st.RowSize)))
		}
	}
	for _, b := range blobs {
		ext, off, dst, err := c.alloc(g, gi, int64(len(b.Data)))
		if err != nil {
			return 0, 0, err
		}
		copy(dst, b.Data)
		c.mu.Lock()
		g.extents[ext].used = alignUp(off + int64(len(b.Data)))
		c.mu.Unlock()
		seg.Blobs = append(seg.Blobs, segBlob{Name: b.Name, Extent: uint32(ext), Off: uint64(off), Len: uint64(len(b.Data))})
		bytes += int64(len(b.Data))
	}
	return bytes, need, nil
}

// copyAlone copies table nt by plan cp into room of its own at the end of an extent of
// generation g, growing it when the copy reports the room short: a slotted copy is offered the
// largest free room, or want bytes (the need a copy already reported) if more.
func (c *Checkpointer) copyAlone(g *generation, gi int, nt namedTable, cp copyPlan, changedOnly bool, want int) (segTable, error) {
	rowSize := nt.t.RawRowSize()
	var wantRoom int64
	if want > 0 {
		wantRoom = copySpace(want, rowSize)
	}
	for attempt := 0; ; attempt++ {
		var size int64
		if cp.slotted {
			c.mu.Lock()
			size = max(wantRoom, g.largestFree())
			c.mu.Unlock()
		} else {
			size = copySpace(nt.t.RawSize(changedOnly), rowSize) << attempt
		}
		ext, off, dst, err := c.alloc(g, gi, size)
		if err != nil {
			return segTable{}, err
		}
		n, counts, key, err := copyTable(nt, cp, changedOnly, dst)
		if errors.Is(err, io.ErrShortBuffer) && cp.slotted {
			if n > len(dst) {
				wantRoom = copySpace(n, rowSize)
			} else { // no need reported: grow
				wantRoom = max(2*size, minExtent)
			}
		}
		if errors.Is(err, io.ErrShortBuffer) && attempt < 4 {
			continue
		}
		if err != nil {
			return segTable{}, fmt.Errorf("checkpoint: copy table %s: %w", nt.name, err)
		}
		st, err := tableRecord(nt, ext, off, n, counts, key, len(dst))
		if err != nil {
			return segTable{}, err
		}
		c.mu.Lock()
		g.extents[ext].used = alignUp(off + int64(n))
		c.mu.Unlock()
		return st, nil
	}
}

// copyTable makes one attempt at copying table nt by plan cp into dst, starting a new base: a
// full copy of a ShardedTable also returns its groups' counts and key.
func copyTable(nt namedTable, cp copyPlan, changedOnly bool, dst []byte) (n int, counts []int, key []byte, err error) {
	sharded, _ := nt.t.(ShardedTable)
	switch {
	case sharded != nil && !changedOnly:
		return sharded.CopyRawShards(dst, true)
	case cp.slotted:
		n, err = nt.t.(SlotDeltaTable).CopyRawDelta(dst, cp.changed, cp.whole, true)
		return n, nil, nil, err
	default:
		n, err = nt.t.CopyRaw(dst, changedOnly, true)
		return n, nil, nil, err
	}
}

// tableRecord checks what a copy of table nt into room bytes at (ext, off) reported, and
// describes it for the seal.
func tableRecord(nt namedTable, ext int, off int64, n int, counts []int, key []byte, room int) (segTable, error) {
	rowSize := nt.t.RawRowSize()
	if n < 0 || n > room || n%rowSize != 0 {
		return segTable{}, fmt.Errorf("checkpoint: copy table %s: wrote %d bytes, not whole %d-byte records", nt.name, n, rowSize)
	}
	st := segTable{Name: nt.name, Schema: append([]byte(nil), nt.t.Schema()...),
		RowSize: uint32(rowSize), Extent: uint32(ext), Off: uint64(off), Len: uint64(n), WholeRecords: true}
	if counts != nil {
		total := 0
		st.Groups = make([]uint64, len(counts))
		for i, k := range counts {
			if k < 0 {
				total = -1
				break
			}
			st.Groups[i] = uint64(k)
			total += k
		}
		if total*rowSize != n {
			return segTable{}, fmt.Errorf("checkpoint: copy table %s: group counts of %d records for %d bytes", nt.name, total, n)
		}
		st.Key = key
	}
	return st, nil
}

// copySpace is the space reserved for copying a table whose RawSize is size: rows may be added between
// RawSize and CopyRaw.
func copySpace(size, rowSize int) int64 {
	return int64(size) + int64(size)/16 + int64(64*rowSize)
}

// minExtent is the smallest extent created.
const minExtent = 1 << 20

// alloc returns n bytes of free space at the end of an extent of generation g, creating an extent
// when none has room. The space is reserved only when the caller advances the extent's used mark.
func (c *Checkpointer) alloc(g *generation, gi int, n int64) (int, int64, []byte, error) {
	for {
		c.mu.Lock()
		for i, x := range g.extents {
			if int64(len(x.data))-x.used >= n {
				off := x.used
				c.mu.Unlock()
				return i, off, x.data[off : off+n : off+n], nil
			}
		}
		c.mu.Unlock()
		if err := c.addExtent(g, gi, n+int64(float64(n)*c.cfg.Headroom)); err != nil {
			return 0, 0, nil, err
		}
	}
}

// ensureFree makes sure one extent of generation g has n free bytes at its end.
func (c *Checkpointer) ensureFree(g *generation, gi int, n int64) error {
	c.mu.Lock()
	free := g.largestFree()
	c.mu.Unlock()
	if free >= n {
		return nil
	}
	return c.addExtent(g, gi, n+int64(float64(n)*c.cfg.Headroom))
}

// addExtent creates a pre-faulted extent of at least size bytes for generation g. It is slow (every
// page is faulted in) and takes no lock while it works.
func (c *Checkpointer) addExtent(g *generation, gi int, size int64) error {
	page := int64(os.Getpagesize())
	size = max(size, minExtent)
	size = (size + page - 1) / page * page
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	seq := c.reg.seq
	c.reg.seq++
	c.mu.Unlock()
	x, err := c.reg.newExtent(gi, seq, size)
	if err != nil {
		return err
	}
	c.mu.Lock()
	g.extents = append(g.extents, x)
	c.mu.Unlock()
	return nil
}

// Reserve makes sure each generation has an extent of at least bytes, creating pre-faulted extents as
// needed, so that snapshots up to that size allocate nothing while training waits. Creating shared
// memory is slow (every page is faulted in once); call Reserve at start-up with the expected size of
// a full snapshot plus room for deltas. Snapshots grow the region themselves when it is too small.
//
// The generations are reserved at once: each file's blocks are reserved by one thread (the file
// system serialises them), and the two files' reservations overlap.
func (c *Checkpointer) Reserve(ctx context.Context, bytes int64) error {
	c.snapMu.Lock()
	defer c.snapMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	var eg errgroup.Group
	for gi, g := range c.reg.gens {
		c.mu.Lock()
		have := g.largest()
		c.mu.Unlock()
		if have >= bytes {
			continue
		}
		eg.Go(func() error { return c.addExtent(g, gi, bytes) })
	}
	return eg.Wait()
}
