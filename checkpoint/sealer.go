package checkpoint

import (
	"golang.org/x/sync/errgroup"
)

// sealLoop checksums each new segment, rewrites its generation's seal file, hands the segment to the
// persister, and then grows shared memory ahead of the next snapshots. The sealing, each checksum
// piece and the growing wait while a Checkpointer sharing its Gate copies. A segment a Load or Restore
// abandoned is passed on unsealed: nothing can commit it, and the persister drops it.
func (c *Checkpointer) sealLoop() {
	defer c.wg.Done()
	for {
		job, ok := c.sealQ.pop(c.ctx)
		if !ok {
			return
		}
		c.mu.Lock()
		live := c.liveLocked(job)
		c.mu.Unlock()
		if !live {
			c.persistQ.push(job)
			c.doneWork(job.gen)
			continue
		}
		_ = c.cfg.Gate.wait(c.ctx) // after Close, seal anyway: nothing is held back then
		if c.hooks.beforeSeal != nil {
			c.hooks.beforeSeal(job.step)
		}
		c.seal(job)
		if c.hooks.afterSeal != nil {
			c.hooks.afterSeal(job.step)
		}
		c.persistQ.push(job)
		if c.cfg.Gate.wait(c.ctx) == nil {
			c.provision(job.gen)
		}
		c.doneWork(job.gen)
	}
}

func (c *Checkpointer) seal(job stageJob) {
	g := job.gen
	c.mu.Lock()
	seg := g.segs[job.idx]
	tdata := make([][]byte, len(seg.Tables))
	for ti, t := range seg.Tables {
		tdata[ti] = g.data(t.Extent, t.Off, t.Len)
	}
	bdata := make([][]byte, len(seg.Blobs))
	for bi, b := range seg.Blobs {
		bdata[bi] = g.data(b.Extent, b.Off, b.Len)
	}
	c.mu.Unlock()
	sums := make([][]uint64, len(seg.Tables))
	var eg errgroup.Group
	eg.SetLimit(c.cfg.Workers)
	for ti, t := range seg.Tables {
		data := tdata[ti]
		spans := t.spans(sealPiece)
		sums[ti] = make([]uint64, len(spans))
		for p, sp := range spans {
			eg.Go(func() error {
				_ = c.cfg.Gate.wait(c.ctx) // as above
				sums[ti][p] = xxhashSum(data[sp.lo:sp.hi])
				return nil
			})
		}
	}
	blobSums := make([]uint64, len(seg.Blobs))
	for bi := range seg.Blobs {
		blobSums[bi] = xxhashSum(bdata[bi])
	}
	_ = eg.Wait()

	c.mu.Lock()
	for ti := range seg.Tables {
		seg.Tables[ti].Sums = sums[ti]
	}
	for bi := range seg.Blobs {
		seg.Blobs[bi].Sum = blobSums[bi]
	}
	g.sealed = job.idx + 1
	sf := &sealFile{Job: c.cfg.Job, Node: c.cfg.Node, Gen: uint32(g.idx), Slots: c.cfg.Slots, Piece: sealPiece,
		Segments: append([]*segment(nil), g.segs[:g.sealed]...)}
	for _, x := range g.extents {
		sf.Extents = append(sf.Extents, extentRef{Name: x.name, Size: uint64(len(x.data))})
	}
	c.mu.Unlock()

	err := c.reg.writeSeal(sf)
	c.mu.Lock()
	if err != nil {
		c.stats.SealErrors++
	} else {
		c.stats.Seals++
	}
	c.mu.Unlock()
	if err != nil {
		c.log.Warn("checkpoint: sealing shared memory failed; this step can be restored only from storage",
			"step", job.step, "gen", g.idx, "err", err)
	}
}

// provision grows shared memory in the background: generation g gets room for another delta as large
// as the largest seen and a sixteenth more, as tables grow (before any delta, as large as the newest
// full snapshot, which bounds it: every row changed), and the other generation room for the next
// full snapshot (of the tables as large as they are now, or as the newest full one, and a sixteenth
// more), so those snapshots do not create and fault in memory while training waits. The first
// bound costs the generation of the first chain up to one full snapshot's room that a smaller
// first delta leaves unused.
func (c *Checkpointer) provision(g *generation) {
	c.mu.Lock()
	other := c.reg.gens[1-g.idx]
	wantDelta := int64(0)
	if c.cfg.FullEvery > 1 {
		wantDelta = c.maxDelta
		if wantDelta == 0 {
			wantDelta = c.lastFull
		}
		wantDelta += wantDelta / 16
	}
	deltaShort := wantDelta > 0 && g.largestFree() < wantDelta
	lastFull := c.lastFull
	c.mu.Unlock()
	wantFull := int64(0)
	if lastFull > 0 {
		wantFull = max(lastFull, c.fullRoom())
		wantFull += wantFull / 16
	}
	c.mu.Lock()
	fullShort := wantFull > 0 && other.largest() < wantFull
	c.mu.Unlock()
	if deltaShort {
		if err := c.addExtent(g, g.idx, wantDelta+int64(float64(wantDelta)*c.cfg.Headroom)); err != nil {
			c.log.Warn("checkpoint: growing shared memory failed", "gen", g.idx, "err", err)
		}
	}
	if fullShort && c.ctx.Err() == nil {
		if err := c.addExtent(other, other.idx, wantFull+int64(float64(wantFull)*c.cfg.Headroom)); err != nil {
			c.log.Warn("checkpoint: growing shared memory failed", "gen", other.idx, "err", err)
		}
	}
}

// fullRoom is the room copyInto places a full copy of the tables in now, blobs aside.
func (c *Checkpointer) fullRoom() int64 {
	var n int64
	for _, nt := range c.tables {
		n += alignUp(copySpace(nt.t.RawSize(false), nt.t.RawRowSize()))
	}
	return n
}
