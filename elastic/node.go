package elastic

import (
	"context"
	"encoding/binary"
	"errors"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/ps"
)

// AppliedBlob names the blob of a server's applied positions (ps.Server.AppliedState) in its part
// of a checkpoint: a server saves it with every snapshot, and the coordinator reads the commit's
// at a Partial recovery.
const AppliedBlob = "ps.applied"

// ParameterServer is a parameter server as the coordinator drives it. server.Server implements
// it for a ps.Server in the caller's process, remote.Server for one in another process.
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
	// Snapshot copies the server's state (rows of the slots it owns, dense tensors, the batches
	// it applied) into its flash checkpoint as step. Training is paused at a barrier meanwhile;
	// persisting to storage goes on in the background. First the server brings its record of
	// applied batches up to where the data stands, so that what it saves is bounded by what is
	// in flight: committed is how far the data was done at the job's newest commit (its batches
	// can never be replayed: the server forgets them), accepted how far the dispatcher has
	// accepted it at this barrier (every batch it covers is applied on every server: the server
	// folds it into its watermarks).
	Snapshot(ctx context.Context, step uint64, committed, accepted Progress) (checkpoint.SnapshotInfo, error)
	// WaitPersisted waits until the snapshot of step is in storage and returns its manifest.
	WaitPersisted(ctx context.Context, step uint64) (checkpoint.ManifestRef, error)
	// Verify checks that the commit of step can be loaded for the slots t gives this server.
	Verify(ctx context.Context, step uint64, t *ps.OwnerTable) error
	// Load restores the state of step for the slots t gives this server, which must be fresh
	// (no trained row): how a job resumes.
	Load(ctx context.Context, step uint64, t *ps.OwnerTable) error

	// Health answers whether the server is up, and as which incarnation: a new value every time
	// its process (or server.Server) starts, so a server that restarted shows.
	Health(ctx context.Context) (ServerHealth, error)
	// Admit directs every later call at incarnation inc: a server of another incarnation (one
	// that restarted since) refuses them with ErrReplaced instead of acting on them.
	Admit(inc uint64)
	// Restore recovers the state of step, after a server failed, for the slots mode selects
	// among those t gives this server; what the server holds for them is cleared first. Step 0
	// (no commit yet) clears without loading.
	Restore(ctx context.Context, step uint64, t *ps.OwnerTable, mode RestoreMode) error

	// Lead makes coordinator incarnation inc the one the server obeys: from then on it refuses
	// the calls of every earlier coordinator (ErrSuperseded), and Lead itself fails with
	// ErrSuperseded when a later coordinator already leads it. A coordinator leads its servers
	// before it drives them.
	Lead(ctx context.Context, inc uint64) error
	// Table returns the server's owner table (nil: it has none and serves nothing).
	Table(ctx context.Context) (*ps.OwnerTable, error)
}

// ServerHealth is a server's answer to Health.
type ServerHealth struct {
	// Incarnation identifies the server's process (never 0).
	Incarnation uint64
	// TableVersion is the owner table it serves (0: none, it serves nothing).
	TableVersion uint64
	// Leader is the incarnation of the coordinator it obeys (Lead; 0: none yet).
	Leader uint64
	// Snapshot is the step of the newest snapshot it took or restored (0: none): a coordinator
	// that takes over numbers its checkpoints above it.
	Snapshot uint64
	// Restoring is the version of the owner table a Restore of the server was for, until a
	// table that new is installed (0: none). Such a server is being restored, or was and waits
	// for its table: its rows agree with no table it has had, so a coordinator that takes the
	// job over returns every server to the commit.
	Restoring uint64
}

// RestoreMode selects the slots a Restore recovers.
type RestoreMode uint8

const (
	// RestoreAll clears every slot and loads all the slots the table gives the server
	// (Rollback: the whole job returns to a commit), from its own shared memory where it still
	// has the commit, else from storage.
	RestoreAll RestoreMode = iota + 1
	// RestoreNew loads only the slots the table gives the server that its current table does
	// not (all of them on a server without a table): a failed server's slots, onto its
	// replacement or onto survivors (Partial). The slots it serves are left alone, and it goes
	// on serving them meanwhile.
	RestoreNew
	// RestoreForget loads nothing (step is ignored): the server forgets what it holds for the
	// slots the table does not give it (rows, dense tensors, applied positions), rows it kept
	// of slots a table took from it without a move's release. A coordinator that takes a job
	// over and finishes a publication its predecessor left half done calls it, after the
	// server has installed the table.
	RestoreForget
)

// Progress is how far the dispatcher has accepted the training data at a barrier: every data
// epoch below Epoch is finished, and in Epoch each listed shard is accepted through its offset.
// Every batch it covers was applied on every server (a worker reports a batch once its pushes
// are acknowledged). Once a commit holds it, such a batch can never be replayed, so the servers
// forget having applied it.
type Progress struct {
	// Epoch is the current data epoch: every earlier one is done as a whole.
	Epoch uint32
	// Offsets are, per shard of the current epoch, the record offset up to which it is done.
	Offsets map[ps.DataShard]int64
}

// Done reports whether the batch at p can never be replayed.
func (d Progress) Done(p ps.Position) bool {
	if p.Epoch < d.Epoch {
		return true
	}
	off, ok := d.Offsets[ps.DataShard{Epoch: p.Epoch, Shard: p.Shard}]
	return ok && p.End <= off
}

// Through returns the offset through which shard k of the current epoch is done (0: none, or
// an earlier epoch: a finished epoch may hold shards given up part of the way): what a server
// folds into its watermarks (ps.Server.FoldApplied).
func (d Progress) Through(k ps.DataShard) int64 {
	if k.Epoch != d.Epoch {
		return 0
	}
	return d.Offsets[ps.DataShard{Epoch: k.Epoch, Shard: k.Shard}]
}

// AppendBinary appends d's encoding (epoch u32, count u32, per shard: epoch u32, shard u32,
// offset u64, little-endian) to b: how commits and the control protocol carry it.
func (d Progress) AppendBinary(b []byte) ([]byte, error) {
	b = binary.LittleEndian.AppendUint32(b, d.Epoch)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(d.Offsets)))
	for k, off := range d.Offsets {
		b = binary.LittleEndian.AppendUint32(b, k.Epoch)
		b = binary.LittleEndian.AppendUint32(b, k.Shard)
		b = binary.LittleEndian.AppendUint64(b, uint64(off))
	}
	return b, nil
}

// progressBytes is d's encoding (AppendBinary cannot fail).
func progressBytes(d Progress) []byte {
	b, _ := d.AppendBinary(nil)
	return b
}

// errMalformedProgress is UnmarshalBinary's error for input AppendBinary did not write.
var errMalformedProgress = errors.New("elastic: malformed data progress")

// UnmarshalBinary decodes what AppendBinary wrote, into d.
func (d *Progress) UnmarshalBinary(b []byte) error {
	if len(b) < 8 {
		return errMalformedProgress
	}
	p := Progress{Epoch: binary.LittleEndian.Uint32(b)}
	n := int(binary.LittleEndian.Uint32(b[4:]))
	b = b[8:]
	if n*16 != len(b) || n > len(b) {
		return errMalformedProgress
	}
	p.Offsets = make(map[ps.DataShard]int64, n)
	for ; len(b) > 0; b = b[16:] {
		k := ps.DataShard{Epoch: binary.LittleEndian.Uint32(b), Shard: binary.LittleEndian.Uint32(b[4:])}
		p.Offsets[k] = int64(binary.LittleEndian.Uint64(b[8:]))
	}
	*d = p
	return nil
}
