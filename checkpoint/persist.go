package checkpoint

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/klauspost/compress/s2"
	"golang.org/x/sync/errgroup"
)

// persistLoop persists sealed segments in order.
func (c *Checkpointer) persistLoop() {
	defer c.wg.Done()
	for {
		job, ok := c.persistQ.pop(c.ctx)
		if !ok {
			return
		}
		c.persistOne(job)
		c.doneWork(job.gen)
	}
}

// persistOne persists one segment and reports the result to the segment's own waiter and OnPersist,
// unless a Load or Restore abandoned the segment first: then it is not persisted at all, or, if that
// happened while it was being written, what was written is removed and nothing is reported.
func (c *Checkpointer) persistOne(job stageJob) {
	start := time.Now()
	c.mu.Lock()
	if !c.liveLocked(job) {
		c.mu.Unlock()
		return
	}
	ctx := c.epochCtx
	p := c.planLocked(job)
	c.mu.Unlock()

	res, w, err := c.persist(ctx, p)
	res.Step, res.Full, res.Segments, res.Duration = job.step, p.full, len(p.segs), time.Since(start)
	closing := c.ctx.Err() != nil
	if err != nil {
		if closing {
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
		res.Err = &PersistError{Step: job.step, Err: err}
	}

	c.reportMu.Lock()
	c.mu.Lock()
	live := c.liveLocked(job)
	if live {
		if res.Err == nil {
			c.stats.Persists++
			c.stats.PersistedRaw += uint64(res.RawBytes)
			c.stats.PersistedStored += uint64(res.Stored)
			c.durable = durablePos{ok: true, gen: job.gen.idx, chain: job.chain, seg: job.idx, step: job.step,
				baseStep: p.baseStep, manifest: res.Manifest.Name}
		} else {
			c.stats.PersistErrors++
			c.stats.LastPersistError = res.Err
		}
		job.wait.finishLocked(res)
	}
	c.mu.Unlock()
	if live {
		if res.Err != nil && !closing {
			c.log.Warn("checkpoint: persist failed; earlier commits are intact and the next persist carries these rows",
				"step", job.step, "err", res.Err)
		}
		if c.cfg.OnPersist != nil {
			c.cfg.OnPersist(res)
		}
	}
	c.reportMu.Unlock()
	if !live && res.Err == nil {
		// Abandoned after it was written: its manifest was never handed out, so nothing can commit it.
		w.cleanup()
	}
}

// persistPlan is what one persist writes: segments [first, last] of a generation's chain.
type persistPlan struct {
	step       uint64
	full       bool
	baseStep   uint64 // step of the full checkpoint in storage the chain starts at
	parent     string
	parentStep uint64
	segs       []*segment // the segments to carry, oldest first
	chainIDs   []uint64   // ids of the whole chain through the last segment
	sameSlots  bool       // every segment of the chain owns the same slots
	tables     [][][]byte // tables[t][k]: records of table t in segs[k]
	blobs      [][]byte   // blobs of the last segment
	id         uint64
}

// planLocked resolves what the persist of job writes: the segment alone if the chain's previous
// segment is durable, else every segment back to the newest durable one, or to the base. The caller
// holds mu.
func (c *Checkpointer) planLocked(job stageJob) persistPlan {
	g := job.gen
	p := persistPlan{step: job.step, id: c.newIDLocked()}
	first := 0
	p.baseStep = job.step // a full checkpoint is its own base, even when it carries several segments
	if d := c.durable; d.ok && d.gen == g.idx && d.chain == job.chain && d.seg < job.idx {
		first = d.seg + 1
		p.parent, p.parentStep, p.baseStep = d.manifest, d.step, d.baseStep
	}
	p.full = first == 0
	p.segs = append([]*segment(nil), g.segs[first:job.idx+1]...)
	p.sameSlots = true
	for _, s := range g.segs[:job.idx+1] {
		p.chainIDs = append(p.chainIDs, s.ID)
		p.sameSlots = p.sameSlots && s.Owned.equal(g.segs[0].Owned)
	}
	last := p.segs[len(p.segs)-1]
	p.tables = make([][][]byte, len(last.Tables))
	for ti := range last.Tables {
		for _, s := range p.segs {
			t := s.Tables[ti]
			p.tables[ti] = append(p.tables[ti], g.data(t.Extent, t.Off, t.Len))
		}
	}
	for _, b := range last.Blobs {
		p.blobs = append(p.blobs, g.data(b.Extent, b.Off, b.Len))
	}
	return p
}

// persist writes the chunks and blobs of p, then its manifest, and returns the writer that knows their
// names. On failure it deletes what it wrote (best effort; the names are unique to this attempt, so
// nothing else refers to them).
func (c *Checkpointer) persist(ctx context.Context, p persistPlan) (PersistResult, *objWriter, error) {
	var res PersistResult
	last := p.segs[len(p.segs)-1]
	keep := survivors(p.segs)
	m := &manifest{Job: c.cfg.Job, Node: c.cfg.Node, Step: p.step, ID: p.id, Slots: c.cfg.Slots,
		Owned: last.Owned, Kept: keep[0], Full: p.full, BaseStep: p.baseStep, Segments: p.chainIDs}
	if p.full {
		m.Kept = last.Owned
	} else {
		m.Parent, m.ParentStep = p.parent, p.parentStep
	}
	dir := m.dir()
	w := &objWriter{c: c, dir: dir}
	fail := func(err error) (PersistResult, *objWriter, error) {
		w.cleanup()
		return res, w, err
	}
	for ti, t := range last.Tables {
		mt := manifestTable{Name: t.Name, Schema: t.Schema, RowSize: t.RowSize}
		chunks, err := c.writeTable(ctx, w, ti, p.tables[ti], int(t.RowSize), keep)
		if err != nil {
			return fail(fmt.Errorf("table %s: %w", t.Name, err))
		}
		for _, ch := range chunks {
			mt.Records += ch.Records
		}
		mt.Chunks = chunks
		m.Tables = append(m.Tables, mt)
	}
	for bi, b := range last.Blobs {
		if err := c.cfg.Gate.wait(ctx); err != nil {
			return fail(err)
		}
		ref, err := w.putBlob(ctx, blobObject(bi), b.Name, p.blobs[bi], c.cfg.Codec, c.cs)
		if err != nil {
			return fail(fmt.Errorf("blob %s: %w", b.Name, err))
		}
		m.Blobs = append(m.Blobs, ref)
	}
	version := uint32(manifestVersion)
	if p.sameSlots {
		version = 1 // what an earlier release reads right
	}
	body := appendManifestVersion(nil, m, version)
	name := manifestName(dir)
	if err := w.put(ctx, name, body); err != nil {
		return fail(err)
	}
	res.Manifest = ManifestRef{Node: c.cfg.Node, Step: p.step, Name: name, Size: int64(len(body)), Sum: xxhashSum(body)}
	res.Chunks, res.RawBytes, res.Stored = w.chunks, w.raw, w.stored+int64(len(body))
	return res, w, nil
}

// objWriter writes the objects of one persist (or commit) and remembers them for cleanup.
type objWriter struct {
	c      *Checkpointer
	st     Storage
	dir    string
	mu     sync.Mutex
	names  []string
	chunks int
	raw    int64
	stored int64
}

func (w *objWriter) storage() Storage {
	if w.st != nil {
		return w.st
	}
	return w.c.cfg.Storage
}

func (w *objWriter) put(ctx context.Context, name string, data []byte) error {
	w.mu.Lock()
	w.names = append(w.names, name)
	w.mu.Unlock()
	return putObject(ctx, w.storage(), name, data)
}

// cleanup deletes every object written, newest first, so a manifest (written last) goes before the
// chunks it names.
func (w *objWriter) cleanup() {
	// The persist context may be cancelled (Close, a restore); cleanup is best effort with a fresh one.
	ctx := context.Background()
	w.mu.Lock()
	names := slices.Clone(w.names)
	w.mu.Unlock()
	for _, n := range slices.Backward(names) {
		_ = w.storage().Delete(ctx, n)
	}
}

func (w *objWriter) putBlob(ctx context.Context, object, name string, data []byte, codec Codec, cs *codecs) (blobRef, error) {
	file := appendChunk(nil, chunkInfo{kind: chunkKindBlob}, data, codec, cs)
	if err := w.put(ctx, w.dir+"/"+object, file); err != nil {
		return blobRef{}, err
	}
	w.mu.Lock()
	w.raw += int64(len(data))
	w.stored += int64(len(file))
	w.mu.Unlock()
	return blobRef{Name: name, Object: object, RawLen: uint64(len(data)), Size: uint64(len(file)), Sum: chunkSum(file)}, nil
}

// chunkSum returns the trailer of an encoded chunk: the xxhash64 of everything before it, which the
// manifest records as the chunk's checksum.
func chunkSum(file []byte) uint64 {
	if len(file) < 8 {
		return 0
	}
	return binary.LittleEndian.Uint64(file[len(file)-8:])
}

// chunkSpan is one chunk to write: records order[from:to] of table slots [lo, hi), part part.
type chunkSpan struct {
	lo, hi, part int
	from, to     int
}

// survivors returns, for each of the segments segs (oldest first), the slots whose rows of that
// segment survive to the last one: those owned in it and in every later one.
func survivors(segs []*segment) []slotSet {
	out := make([]slotSet, len(segs))
	for k := len(segs) - 1; k >= 0; k-- {
		out[k] = segs[k].Owned
		if k+1 < len(segs) {
			out[k] = out[k].intersect(out[k+1])
		}
	}
	return out
}

// writeTable partitions the records of srcs (applied in order) by slot into chunks of about
// ChunkBytes, dropping the records of srcs[k] whose slot is not in keep[k], and writes the chunks
// in parallel. It starts, and starts each chunk, once no copy of the Checkpointers sharing its
// Gate is in progress.
func (c *Checkpointer) writeTable(ctx context.Context, w *objWriter, ti int, srcs [][]byte, rowSize int, keep []slotSet) ([]chunkRef, error) {
	if err := c.cfg.Gate.wait(ctx); err != nil { // the pass over every record below
		return nil, err
	}
	S := c.cfg.Slots
	var n int
	starts := make([]int, len(srcs)+1) // record index where each source starts
	for k, s := range srcs {
		if len(s)%rowSize != 0 {
			return nil, fmt.Errorf("segment of %d bytes is not whole %d-byte records", len(s), rowSize)
		}
		n += len(s) / rowSize
		starts[k+1] = n
	}
	if n > math.MaxUint32 {
		return nil, fmt.Errorf("%d records in one persist is more than supported", n)
	}
	// Slot of every record (S for a dropped record) and records per slot.
	recSlot := make([]uint32, n)
	counts := make([]int, S+1)
	i := 0
	for k, s := range srcs {
		owned := keep[k]
		for off := 0; off < len(s); off += rowSize {
			slot := slotOf(recordID(s[off:]), S)
			if !owned.has(slot) {
				slot = S
			}
			recSlot[i] = uint32(slot)
			counts[slot]++
			i++
		}
	}
	// Cut the slots into ranges of about ChunkBytes: a range closes before the slot that would make
	// it too large; a single slot larger than that becomes a range of its own, written in parts.
	perChunk := max(c.cfg.ChunkBytes/rowSize, 1)
	rangeOf := make([]int32, S)
	var bounds []int // range r covers slots [bounds[r], bounds[r+1])
	lo, acc := 0, 0
	for s := range S {
		if acc > 0 && acc+counts[s] > perChunk {
			bounds = append(bounds, lo)
			lo, acc = s, 0
		}
		acc += counts[s]
		rangeOf[s] = int32(len(bounds))
	}
	bounds = append(bounds, lo, S)
	nr := len(bounds) - 1
	// Stable counting sort of record indices by range: within a range records keep the order of the
	// segments (so a later record of an id follows an earlier one), and a chunk is gathered by one
	// pass through the segments in address order, which is much kinder to the TLB than slot order.
	first := make([]int, nr+1)
	for s := range S {
		first[rangeOf[s]+1] += counts[s]
	}
	for r := range nr {
		first[r+1] += first[r]
	}
	order := make([]uint32, first[nr])
	next := append([]int(nil), first[:nr]...)
	for i, s := range recSlot {
		if int(s) < S {
			r := rangeOf[s]
			order[next[r]] = uint32(i)
			next[r]++
		}
	}
	recSlot = nil
	var spans []chunkSpan
	for r := range nr {
		from, to := first[r], first[r+1]
		for part := 0; from < to; part++ {
			end := min(from+perChunk, to)
			spans = append(spans, chunkSpan{lo: bounds[r], hi: bounds[r+1], part: part, from: from, to: end})
			from = end
		}
	}

	refs := make([]chunkRef, len(spans))
	eg, ctx := errgroup.WithContext(ctx)
	eg.SetLimit(c.cfg.Workers + 2) // two more than the CPUs, so writes and fsyncs overlap the CPU work
	for k, sp := range spans {
		eg.Go(func() error {
			if err := c.cfg.Gate.wait(ctx); err != nil {
				return err
			}
			// Gather the records behind a reserved header, so a chunk stored raw is written from
			// this buffer as it is.
			gathered := getBuf(chunkHeader + (sp.to-sp.from)*rowSize + 8)
			defer putBuf(gathered)
			b := (*gathered)[:chunkHeader]
			for _, idx := range order[sp.from:sp.to] {
				src := 0
				if len(srcs) > 1 {
					src = sort.SearchInts(starts, int(idx)+1) - 1
				}
				off := (int(idx) - starts[src]) * rowSize
				b = append(b, srcs[src][off:off+rowSize]...)
			}
			buf := b[chunkHeader:]
			ci := chunkInfo{kind: chunkKindRows, rowSize: uint32(rowSize), slotLo: uint32(sp.lo), slotHi: uint32(sp.hi),
				part: uint32(sp.part), records: uint64(sp.to - sp.from)}
			var file []byte
			if c.cs.worthCompressing(buf, c.cfg.Codec) {
				out := getBuf(chunkHeader + 8 + max(s2.MaxEncodedLen(len(buf)), len(buf)+len(buf)/64+1024))
				defer putBuf(out)
				file = appendChunkWith((*out)[:0], ci, buf, c.cfg.Codec, c.cs)
				*out = file[:0]
			} else {
				file = chunkInPlace(b, ci)
				*gathered = file[:0]
			}
			object := chunkObject(ti, sp.lo, sp.part)
			if err := w.put(ctx, w.dir+"/"+object, file); err != nil {
				return err
			}
			refs[k] = chunkRef{Object: object, SlotLo: uint32(sp.lo), SlotHi: uint32(sp.hi), Part: uint32(sp.part),
				Records: ci.records, RawLen: uint64(len(buf)), Size: uint64(len(file)), Sum: chunkSum(file)}
			w.mu.Lock()
			w.chunks++
			w.raw += int64(len(buf))
			w.stored += int64(len(file))
			w.mu.Unlock()
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		return nil, err
	}
	return refs, nil
}

// bufPool recycles chunk-sized buffers.
var bufPool sync.Pool

func getBuf(n int) *[]byte {
	if v, ok := bufPool.Get().(*[]byte); ok && cap(*v) >= n {
		return v
	}
	b := make([]byte, 0, n)
	return &b
}

func putBuf(b *[]byte) { bufPool.Put(b) }
