package elastic

import (
	"context"
	"encoding/binary"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/ps"
)

// ParameterServer is a parameter server as the coordinator drives it. LocalServer implements it
// for a ps.Server in the coordinator's process.
//
// Calls come from the coordinator's goroutines, never two of the same kind at once for one
// server. An error means the call did not take effect (a Snapshot or Load that failed changed
// nothing the coordinator relies on; it is retried or the checkpoint is abandoned).
type ParameterServer interface {
	// Node is the server's identity and address in owner tables.
	Node() ps.Node
	// InstallTable makes t the server's owner table (a newer table replaces an older one).
	InstallTable(ctx context.Context, t *ps.OwnerTable) error
	// Fence refuses, from when it returns, every push carrying one of epochs or an epoch below
	// floor; pushes of those epochs in flight have finished by then.
	Fence(ctx context.Context, floor uint64, epochs []uint64) error
	// Snapshot copies the server's state (rows of the slots it owns, dense tensors, the positions
	// it applied) into its flash checkpoint as step. Training is paused at a barrier meanwhile;
	// persisting to storage goes on in the background. First the server forgets the applied
	// positions done says can never be replayed.
	Snapshot(ctx context.Context, step uint64, done Progress) (checkpoint.SnapshotInfo, error)
	// WaitPersisted waits until the snapshot of step is in storage and returns its manifest.
	WaitPersisted(ctx context.Context, step uint64) (checkpoint.ManifestRef, error)
	// Verify checks that the commit of step can be loaded for the slots t gives this server.
	Verify(ctx context.Context, step uint64, t *ps.OwnerTable) error
	// Load restores the state of step for the slots t gives this server.
	Load(ctx context.Context, step uint64, t *ps.OwnerTable) error
}

// Progress is how far the dispatcher has accepted the training data at a barrier: every data
// epoch below Epoch is finished, and in Epoch each listed shard is accepted through its offset. A
// batch position it covers can never be replayed from that barrier on, so the servers forget
// having applied it (the applied sets stay small).
type Progress struct {
	Epoch   uint32
	Offsets map[ShardKey]int64
}

// ShardKey names a shard of a data epoch.
type ShardKey struct{ Epoch, Shard uint32 }

// Done reports whether the batch at p can never be replayed.
func (d Progress) Done(p ps.Position) bool {
	if p.Epoch < d.Epoch {
		return true
	}
	off, ok := d.Offsets[ShardKey{p.Epoch, p.Shard}]
	return ok && p.End <= off
}

// appendProgress encodes d: epoch u32, count u32, per shard: epoch u32, shard u32, offset u64.
func appendProgress(dst []byte, d Progress) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, d.Epoch)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(d.Offsets)))
	for k, off := range d.Offsets {
		dst = binary.LittleEndian.AppendUint32(dst, k.Epoch)
		dst = binary.LittleEndian.AppendUint32(dst, k.Shard)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(off))
	}
	return dst
}

func decodeProgress(b []byte) (Progress, error) {
	d := dec{b: b}
	var p Progress
	if v := d.take(4); v != nil {
		p.Epoch = binary.LittleEndian.Uint32(v)
	}
	n := 0
	if v := d.take(4); v != nil {
		n = int(binary.LittleEndian.Uint32(v))
	}
	if d.err != nil || n*16 != len(d.b) {
		return p, errMalformed
	}
	p.Offsets = make(map[ShardKey]int64, n)
	for range n {
		k := ShardKey{binary.LittleEndian.Uint32(d.take(4)), binary.LittleEndian.Uint32(d.take(4))}
		p.Offsets[k] = int64(d.u64())
	}
	return p, d.end()
}
