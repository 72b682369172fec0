package shard_test

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/elasticps/elasticps/shard"
)

// busyDispatcher returns a dispatcher in the middle of its second epoch, with DOING, DONE,
// FAILED and handed-back shards.
func busyDispatcher(t testing.TB) (*shard.Dispatcher, shard.Config) {
	ctx := context.Background()
	cfg := shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 10, Epochs: 3, Shuffle: true, Seed: 3, MaxFailures: 1, MaxLeasesPerWorker: 2, Incarnation: 5}
	d, _ := newDispatcher(t, cfg)
	for {
		l := mustAcquire(t, d, "a")
		if l.Epoch == 1 {
			if err := d.Report(ctx, "a", l.ID, 4, false); err != nil {
				t.Fatal(err)
			}
			break
		}
		if err := d.Report(ctx, "a", l.ID, l.Shard.Records, true); err != nil {
			t.Fatal(err)
		}
	}
	b := mustAcquire(t, d, "b")
	if err := d.Report(ctx, "b", b.ID, 2, false); err != nil {
		t.Fatal(err)
	}
	d.Evict("b") // FAILED at 2 (MaxFailures 1)
	c := mustAcquire(t, d, "c")
	if err := d.Report(ctx, "c", c.ID, 7, false); err != nil {
		t.Fatal(err)
	}
	if err := d.Leave(ctx, "c"); err != nil { // back on the retry stack at 7
		t.Fatal(err)
	}
	c = mustAcquire(t, d, "c")
	if err := d.Report(ctx, "c", c.ID, c.Shard.Records, true); err != nil {
		t.Fatal(err)
	}
	return d, cfg
}

func TestSnapshotRoundTrip(t *testing.T) {
	d, cfg := busyDispatcher(t)
	snap := d.Snapshot()
	before := d.Progress()
	cfg.Incarnation = 6
	d2, _ := newDispatcher(t, cfg)
	if err := d2.Restore(snap); err != nil {
		t.Fatal(err)
	}
	after := d2.Progress()
	if after.Epoch != 1 || after.Shards.Doing != 0 || after.Shards.Todo != before.Shards.Todo+before.Shards.Doing ||
		after.Shards.Done != before.Shards.Done || after.Shards.Failed != 1 || len(after.Failed) != 1 {
		t.Fatalf("before %+v\nafter %+v", before, after)
	}
	for e := range before.EpochRecords {
		if before.EpochRecords[e] != after.EpochRecords[e] {
			t.Fatalf("epoch %d: %+v vs %+v", e, before.EpochRecords[e], after.EpochRecords[e])
		}
	}
	// Re-encoding the restored state gives the same totals again (DOING became TODO).
	d3, _ := newDispatcher(t, cfg)
	if err := d3.Restore(d2.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if p := d3.Progress(); p.EpochRecords[1] != after.EpochRecords[1] || p.Shards != after.Shards {
		t.Fatalf("%+v vs %+v", p, after)
	}
	// Both continue identically: the same order of shards and offsets.
	for {
		l2, err2 := d2.Acquire(context.Background(), "z")
		l3, err3 := d3.Acquire(context.Background(), "z")
		if (err2 == nil) != (err3 == nil) {
			t.Fatalf("diverged: %v vs %v", err2, err3)
		}
		if err2 != nil {
			break
		}
		if l2.Shard != l3.Shard || l2.Offset != l3.Offset || l2.Epoch != l3.Epoch {
			t.Fatalf("diverged: %+v vs %+v", l2, l3)
		}
		_ = d2.Report(context.Background(), "z", l2.ID, l2.Shard.Records, true)
		_ = d3.Report(context.Background(), "z", l3.ID, l3.Shard.Records, true)
	}
}

func TestRestoreIntoSameInstanceNeverReusesLeaseIDs(t *testing.T) {
	ctx := context.Background()
	d, _ := newDispatcher(t, shard.Config{Dataset: shard.IndexedDataset(100), ShardSize: 10})
	snap := d.Snapshot()
	old := mustAcquire(t, d, "w")
	if err := d.Restore(snap); err != nil {
		t.Fatal(err)
	}
	fresh := mustAcquire(t, d, "w")
	if fresh.ID.Seq <= old.ID.Seq {
		t.Fatalf("seq reused: %v after %v", fresh.ID, old.ID)
	}
	if err := d.Report(ctx, "w", old.ID, 5, false); !errors.Is(err, shard.ErrStaleLease) {
		t.Fatalf("pre-restore lease: %v", err)
	}
}

func TestRestoreErrors(t *testing.T) {
	d, cfg := busyDispatcher(t)
	snap := d.Snapshot()
	restore := func(b []byte) error {
		d2, _ := newDispatcher(t, cfg)
		return d2.Restore(b)
	}
	reseal := func(b []byte) []byte {
		b = append([]byte(nil), b[:len(b)-8]...)
		return binary.LittleEndian.AppendUint64(b, xxhash.Sum64(b))
	}
	flip := append([]byte(nil), snap...)
	flip[len(flip)/2] ^= 1
	if err := restore(flip); !errors.Is(err, shard.ErrSnapshotCorrupt) {
		t.Errorf("bit flip: %v", err)
	}
	if err := restore(snap[:len(snap)-1]); !errors.Is(err, shard.ErrSnapshotCorrupt) {
		t.Errorf("truncated: %v", err)
	}
	if err := restore(nil); !errors.Is(err, shard.ErrSnapshotCorrupt) {
		t.Errorf("empty: %v", err)
	}
	v2 := append([]byte(nil), snap...)
	v2[4] = 2
	if err := restore(reseal(v2)); !errors.Is(err, shard.ErrSnapshotVersion) {
		t.Errorf("version: %v", err)
	}
	// A consistent-looking but impossible state: bump the first shard's offset.
	for _, other := range []shard.Config{
		{Dataset: shard.IndexedDataset(101), ShardSize: 10, Epochs: 3, Shuffle: true, Seed: 3},
		{Dataset: shard.IndexedDataset(100), ShardSize: 10, Epochs: 3, Shuffle: true, Seed: 4},
		{Dataset: shard.IndexedDataset(100), ShardSize: 20, Epochs: 3, Shuffle: true, Seed: 3},
		{Dataset: shard.IndexedDataset(100), ShardSize: 10, Epochs: 1, Shuffle: true, Seed: 3},
	} {
		d2, _ := newDispatcher(t, other)
		if err := d2.Restore(snap); !errors.Is(err, shard.ErrSnapshotMismatch) {
			t.Errorf("config %+v: %v", other, err)
		}
	}
	// A failed Restore leaves the dispatcher as it was.
	before := d.Progress()
	if err := d.Restore(flip); err == nil {
		t.Fatal("corrupt restore accepted")
	}
	if after := d.Progress(); after.Shards != before.Shards {
		t.Fatalf("changed by a failed restore: %+v", after)
	}
}

func FuzzRestore(f *testing.F) {
	d, cfg := busyDispatcher(f)
	f.Add(d.Snapshot())
	s, _ := newDispatcher(f, shard.Config{Dataset: shard.StreamDataset(2), ShardSize: 4, Incarnation: 9})
	_ = s.GrowStream(0, 9)
	_ = s.GrowStream(1, 3)
	_ = s.FlushStream()
	f.Add(s.Snapshot())
	f.Add([]byte("EPSD\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, c := range []shard.Config{cfg, {Dataset: shard.StreamDataset(2), ShardSize: 4, Incarnation: 9}} {
			try := func(b []byte) {
				d, _ := newDispatcher(t, c)
				if err := d.Restore(b); err != nil {
					return
				}
				// Whatever was accepted must be a working dispatcher whose totals add up.
				p := d.Progress()
				cur := p.EpochRecords[p.Epoch]
				if cur.Done+cur.Failed > cur.Records || cur.Done < 0 {
					t.Fatalf("restored totals %+v", cur)
				}
				for range 1000 {
					l, err := d.Acquire(context.Background(), "w")
					if err != nil {
						break
					}
					if err := d.Report(context.Background(), "w", l.ID, l.Shard.Records, true); err != nil {
						t.Fatalf("report on restored dispatcher: %v", err)
					}
				}
			}
			try(b)
			if len(b) >= 14 {
				// Also exercise the body parser past the checksum.
				body := append([]byte(nil), b[:len(b)-8]...)
				try(binary.LittleEndian.AppendUint64(body, xxhash.Sum64(body)))
			}
		}
	})
}
