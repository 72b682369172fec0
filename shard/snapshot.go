package shard

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// Snapshot encoding, version 1 (all integers unsigned varints unless noted):
//
//	magic "EPSD" | version uint16 LE | fingerprint uint64 LE | kind byte |
//	incarnation uint64 LE | seq | epochs | epoch | finished byte | sealed byte |
//	#stats, then per started epoch: total done failed |
//	#partitions, then per partition: cut end |
//	#shards | stream only, per shard: partition start end |
//	per shard: state byte, offset, failures |
//	#fresh, shard indices | #retry, shard indices |
//	#failed, then per failed shard: epoch index offset failures |
//	xxhash64 of everything before, uint64 LE
//
// Leases are not saved: on Restore every DOING shard goes back to TODO at its accepted offset.
const (
	snapshotMagic   = "EPSD"
	snapshotVersion = 1
)

// Snapshot returns the dispatcher's state for a checkpoint. Take it when the model holds exactly
// the progress reported so far (see the package documentation).
func (d *Dispatcher) Snapshot() []byte { return d.AppendSnapshot(nil) }

// AppendSnapshot appends the encoded state to dst and returns the extended slice.
func (d *Dispatcher) AppendSnapshot(dst []byte) []byte {
	d.mu.Lock()
	defer d.unlock()
	c := d.c
	c.tick(d.clock.Now())
	start := len(dst)
	b := append(dst, snapshotMagic...)
	b = binary.LittleEndian.AppendUint16(b, snapshotVersion)
	b = binary.LittleEndian.AppendUint64(b, c.fingerprint)
	b = append(b, byte(c.kind))
	b = binary.LittleEndian.AppendUint64(b, c.incarnation)
	b = binary.AppendUvarint(b, c.seq)
	b = binary.AppendUvarint(b, uint64(c.epochs))
	b = binary.AppendUvarint(b, uint64(c.epoch))
	b = append(b, boolByte(c.finished), boolByte(c.sealed))
	b = binary.AppendUvarint(b, uint64(len(c.stats)))
	for _, s := range c.stats {
		b = binary.AppendUvarint(b, uint64(s.total))
		b = binary.AppendUvarint(b, uint64(s.done))
		b = binary.AppendUvarint(b, uint64(s.failed))
	}
	b = binary.AppendUvarint(b, uint64(len(c.parts)))
	for _, p := range c.parts {
		b = binary.AppendUvarint(b, uint64(p.cut))
		b = binary.AppendUvarint(b, uint64(p.end))
	}
	b = binary.AppendUvarint(b, uint64(len(c.shards)))
	if c.kind == KindStream {
		for _, s := range c.shards {
			b = binary.AppendUvarint(b, uint64(s.Partition))
			b = binary.AppendUvarint(b, uint64(s.Start))
			b = binary.AppendUvarint(b, uint64(s.End))
		}
	}
	for i := range c.shards {
		b = append(b, byte(c.st[i]))
		b = binary.AppendUvarint(b, uint64(c.off[i]))
		b = binary.AppendUvarint(b, uint64(c.fails[i]))
	}
	b = binary.AppendUvarint(b, uint64(len(c.fresh)-c.freshHead))
	for _, s := range c.fresh[c.freshHead:] {
		b = binary.AppendUvarint(b, uint64(s))
	}
	b = binary.AppendUvarint(b, uint64(len(c.retry)))
	for _, s := range c.retry {
		b = binary.AppendUvarint(b, uint64(s))
	}
	b = binary.AppendUvarint(b, uint64(len(c.failed)))
	for _, f := range c.failed {
		b = binary.AppendUvarint(b, uint64(f.Epoch))
		b = binary.AppendUvarint(b, uint64(f.Shard.Index))
		b = binary.AppendUvarint(b, uint64(f.Offset))
		b = binary.AppendUvarint(b, uint64(f.Failures))
	}
	return binary.LittleEndian.AppendUint64(b, xxhash.Sum64(b[start:]))
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// Restore replaces the dispatcher's state by a snapshot taken by a dispatcher with the same
// dataset, shard size, seed and shuffle settings. Every lease is dropped: shards that were
// DOING go back to TODO at the offset accepted when the snapshot was taken, and every lease
// granted before (by any instance) is stale from now on. Known workers and their figures are
// forgotten. On error the dispatcher is unchanged.
func (d *Dispatcher) Restore(snapshot []byte) error {
	c := newCore(d.cfg, d.cfg.Incarnation, d.cfg.Logger)
	if err := c.decode(snapshot); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.unlock()
	c.now = d.c.now
	if c.seqIncarnation == d.cfg.Incarnation {
		c.seq = max(c.seq, d.c.seq) // never reuse a sequence number of this incarnation
	} else {
		c.seq = d.c.seq
	}
	c.seqIncarnation = d.cfg.Incarnation
	c.tick(d.clock.Now())
	d.c = c
	return nil
}

// decoder reads the snapshot body; the first problem sticks.
type decoder struct {
	b   []byte
	err error
}

func (r *decoder) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrSnapshotCorrupt, fmt.Sprintf(format, args...))
	}
}

func (r *decoder) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad varint for %s", what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// int reads a varint that must be at most limit.
func (r *decoder) int(what string, limit uint64) int64 {
	v := r.uvarint(what)
	if v > limit {
		r.fail("%s %d exceeds %d", what, v, limit)
		return 0
	}
	return int64(v)
}

// count reads an element count; each element takes at least minBytes bytes.
func (r *decoder) count(what string, minBytes int) int {
	v := r.uvarint(what)
	if r.err == nil && v > uint64(len(r.b)/minBytes) {
		r.fail("%s %d larger than the data left", what, v)
		return 0
	}
	return int(v)
}

func (r *decoder) byte1(what string) byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.fail("truncated at %s", what)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *decoder) fixed64(what string) uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.fail("truncated at %s", what)
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

const maxInt63 = 1<<63 - 1

// decode loads a snapshot into a core freshly built from the same Config, then checks that the
// state it describes is possible.
func (c *core) decode(b []byte) error {
	const header = len(snapshotMagic) + 2
	if len(b) < header+8 || string(b[:len(snapshotMagic)]) != snapshotMagic {
		return fmt.Errorf("%w: bad magic or too short (%d bytes)", ErrSnapshotCorrupt, len(b))
	}
	if v := binary.LittleEndian.Uint16(b[len(snapshotMagic):]); v != snapshotVersion {
		return fmt.Errorf("%w: version %d (this build reads %d)", ErrSnapshotVersion, v, snapshotVersion)
	}
	body, sum := b[:len(b)-8], binary.LittleEndian.Uint64(b[len(b)-8:])
	if xxhash.Sum64(body) != sum {
		return fmt.Errorf("%w: checksum mismatch", ErrSnapshotCorrupt)
	}
	r := &decoder{b: body[header:]}
	if fp := r.fixed64("fingerprint"); r.err == nil && fp != c.fingerprint {
		return fmt.Errorf("%w: fingerprint %x, dispatcher has %x", ErrSnapshotMismatch, fp, c.fingerprint)
	}
	if k := Kind(r.byte1("kind")); r.err == nil && k != c.kind {
		return fmt.Errorf("%w: kind %v, dispatcher has %v", ErrSnapshotMismatch, k, c.kind)
	}
	c.seqIncarnation = r.fixed64("incarnation")
	c.seq = r.uvarint("seq")
	r.uvarint("epochs") // informational: the restoring Config decides
	epoch := r.int("epoch", 1<<31)
	finished := r.byte1("finished")
	sealed := r.byte1("sealed")
	if r.err == nil && (finished > 1 || sealed > 1) {
		r.fail("bad flags %d %d", finished, sealed)
	}
	nstats := r.count("epoch count", 3)
	if r.err == nil && nstats != int(epoch)+1 {
		r.fail("%d epoch totals for epoch %d", nstats, epoch)
	}
	if r.err == nil && int(epoch) >= c.epochs {
		return fmt.Errorf("%w: snapshot is in epoch %d, config has %d epochs", ErrSnapshotMismatch, epoch, c.epochs)
	}
	stats := make([]epochStats, nstats)
	for i := range stats {
		stats[i] = epochStats{total: r.int("total", maxInt63), done: r.int("done", maxInt63), failed: r.int("failed", maxInt63)}
	}
	nparts := r.count("partitions", 2)
	if r.err == nil && nparts != len(c.parts) {
		r.fail("%d partitions, dataset has %d", nparts, len(c.parts))
	}
	parts := make([]partState, nparts)
	for i := range parts {
		parts[i] = partState{cut: r.int("cut", maxInt63), end: r.int("end", maxInt63)}
		if r.err == nil && (parts[i].cut > parts[i].end || parts[i].cut < c.parts[i].cut) {
			r.fail("partition %d cut %d end %d", i, parts[i].cut, parts[i].end)
		}
	}
	nshards := r.count("shards", 3)
	if r.err != nil {
		return r.err
	}
	if c.kind == KindStream {
		next := make([]int64, nparts)
		for p := range next {
			next[p] = c.parts[p].cut
		}
		for i := 0; i < nshards && r.err == nil; i++ {
			p := r.int("partition", uint64(max(nparts-1, 0)))
			start := r.int("start", maxInt63)
			end := r.int("end", maxInt63)
			if r.err == nil && (nparts == 0 || start != next[p] || end <= start || end-start > c.shardSize || end > parts[p].cut) {
				r.fail("stream shard %d [%d, %d) of partition %d out of sequence", i, start, end, p)
				break
			}
			next[p] = end
			c.addShard(Shard{Kind: KindStream, Partition: int(p), Start: start, End: end, Records: end - start, Base: start})
		}
		for p := range next {
			if r.err == nil && next[p] != parts[p].cut {
				r.fail("partition %d shards end at %d, cut is %d", p, next[p], parts[p].cut)
			}
		}
		c.parts = parts
	} else if nshards != len(c.shards) {
		r.fail("%d shards, dataset has %d", nshards, len(c.shards))
	}
	if r.err != nil {
		return r.err
	}
	c.epoch = int(epoch)
	var counts [4]int
	var doneSum, failedSum, total int64
	for i := range c.shards {
		st := shardState(r.byte1("state"))
		off := r.int("offset", uint64(c.shards[i].Records))
		fails := r.int("failures", 1<<16)
		if r.err != nil {
			return r.err
		}
		switch {
		case st > stFailed:
			r.fail("shard %d state %d", i, st)
		case st == stDone && off != c.shards[i].Records:
			r.fail("done shard %d at offset %d", i, off)
		case st != stDone && off == c.shards[i].Records:
			r.fail("shard %d complete but in state %d", i, st)
		}
		if r.err != nil {
			return r.err
		}
		c.st[i], c.off[i], c.fails[i] = st, off, uint32(fails)
		counts[st]++
		doneSum += off
		total += c.shards[i].Records
		if st == stFailed {
			failedSum += c.shards[i].Records - off
		}
	}
	if r.err != nil {
		return r.err
	}
	cur := stats[epoch]
	if cur.total != total || cur.done != doneSum || cur.failed != failedSum {
		r.fail("epoch %d totals %+v do not add up (total %d done %d failed %d)", epoch, cur, total, doneSum, failedSum)
	}
	for e, s := range stats[:epoch] {
		if s.done+s.failed != s.total || s.done < 0 {
			r.fail("finished epoch %d totals %+v do not add up", e, s)
		}
	}
	queued := make([]bool, len(c.shards))
	readQueue := func(what string) []int32 {
		n := r.count(what, 1)
		q := make([]int32, 0, n)
		for range n {
			s := r.int(what, uint64(max(len(c.shards)-1, 0)))
			if r.err != nil {
				return nil
			}
			if len(c.shards) == 0 || c.st[s] != stTodo || queued[s] {
				r.fail("%s holds shard %d twice or not TODO", what, s)
				return nil
			}
			queued[s] = true
			q = append(q, int32(s))
		}
		return q
	}
	fresh := readQueue("fresh queue")
	retry := readQueue("retry queue")
	nfailed := r.count("failed shards", 4)
	failed := make([]FailedShard, 0, nfailed)
	for range nfailed {
		e := r.int("failed epoch", uint64(epoch))
		s := r.int("failed shard", uint64(max(len(c.shards)-1, 0)))
		off := r.int("failed offset", maxInt63)
		n := r.int("failures", 1<<16)
		if r.err != nil {
			return r.err
		}
		if len(c.shards) == 0 || off >= c.shards[s].Records {
			r.fail("failed shard %d offset %d", s, off)
			return r.err
		}
		failed = append(failed, FailedShard{Epoch: int(e), Shard: c.shards[s], Offset: off, Failures: int(n)})
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return r.err
	}
	// Every TODO shard must be queued exactly once; DOING shards go back on the retry stack.
	for i := range c.shards {
		switch c.st[i] {
		case stTodo:
			if !queued[i] {
				return fmt.Errorf("%w: TODO shard %d is in no queue", ErrSnapshotCorrupt, i)
			}
		case stDoing:
			c.st[i] = stTodo
			retry = append(retry, int32(i))
		}
	}
	c.fresh, c.freshHead, c.retry = fresh, 0, retry
	c.nTodo, c.nDoing, c.nDone, c.nFailed = counts[stTodo]+counts[stDoing], 0, counts[stDone], counts[stFailed]
	c.stats = stats
	c.failed = failed
	c.sealed = sealed == 1
	if finished == 1 && c.nTodo > 0 {
		return fmt.Errorf("%w: finished with %d shards to do", ErrSnapshotCorrupt, c.nTodo)
	}
	// A finished job restored with more epochs configured goes on with the next epoch.
	c.maybeAdvance()
	return nil
}
