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
	bytes, need, err := c.copyInto(g, gi, seg, !full, sel, o.blobs)
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
// bytes copied and the space the snapshot needed: what it reserved for plain copies, and the room
// slotted copies took.
func (c *Checkpointer) copyInto(g *generation, gi int, seg *segment, changedOnly bool, sel deltaSel, blobs []Blob) (bytes, need int64, err error) {
	// Make sure one extent can take the whole snapshot, so the copies below do not allocate. A
	// slotted copy is offered the largest free room instead and says what it needs when that is
	// short: RawSize would count the deletion records it leaves out, and nothing bounds the rows
	// of the slots gained short of a pass over the table.
	for _, nt := range c.tables {
		if !planCopy(nt.t, changedOnly, sel).slotted {
			need += alignUp(copySpace(nt.t.RawSize(changedOnly), nt.t.RawRowSize()))
		}
	}
	for _, b := range blobs {
		need += alignUp(int64(len(b.Data)))
	}
	if err := c.ensureFree(g, gi, need); err != nil {
		return 0, 0, err
	}
	var total int64
	for _, nt := range c.tables {
		rowSize := nt.t.RawRowSize()
		var n int
		var ext int
		var off int64
		var counts []int
		var key []byte
		sharded, _ := nt.t.(ShardedTable)
		var want int64 // the need a short slotted copy reported
		cp := planCopy(nt.t, changedOnly, sel)
		for attempt := 0; ; attempt++ {
			var size int64
			if cp.slotted {
				c.mu.Lock()
				size = max(want, g.largestFree())
				c.mu.Unlock()
			} else {
				size = copySpace(nt.t.RawSize(changedOnly), rowSize) << attempt
			}
			var dst []byte
			var err error
			ext, off, dst, err = c.alloc(g, gi, size)
			if err != nil {
				return 0, 0, err
			}
			switch {
			case sharded != nil && !changedOnly:
				n, counts, key, err = sharded.CopyRawShards(dst, true)
			case cp.slotted:
				n, err = nt.t.(SlotDeltaTable).CopyRawDelta(dst, cp.changed, cp.whole, true)
				if errors.Is(err, io.ErrShortBuffer) {
					if n > len(dst) {
						want = copySpace(n, rowSize)
					} else { // no need reported: grow
						want = max(2*size, minExtent)
					}
				}
			default:
				n, err = nt.t.CopyRaw(dst, changedOnly, true)
			}
			if errors.Is(err, io.ErrShortBuffer) && attempt < 4 {
				continue
			}
			if err != nil {
				return 0, 0, fmt.Errorf("checkpoint: copy table %s: %w", nt.name, err)
			}
			if n < 0 || n > len(dst) || n%rowSize != 0 {
				return 0, 0, fmt.Errorf("checkpoint: copy table %s: wrote %d bytes, not whole %d-byte records", nt.name, n, rowSize)
			}
			break
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
				return 0, 0, fmt.Errorf("checkpoint: copy table %s: group counts of %d records for %d bytes", nt.name, total, n)
			}
			st.Key = key
		}
		c.mu.Lock()
		g.extents[ext].used = alignUp(off + int64(n))
		c.mu.Unlock()
		seg.Tables = append(seg.Tables, st)
		total += int64(n)
		if cp.slotted {
			need += alignUp(copySpace(n, rowSize))
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
		total += int64(len(b.Data))
	}
	return total, need, nil
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
