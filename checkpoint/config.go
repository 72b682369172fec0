package checkpoint

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
)

// Defaults of Config and CommitterConfig.
const (
	defaultSlots      = 4096 // ps.DefaultSlots: Config.Slots must match the job's
	DefaultShmDir     = "/dev/shm/elasticps"
	DefaultFullEvery  = 10
	DefaultChunkBytes = 32 << 20
	DefaultHeadroom   = 0.5
	DefaultKeepLast   = 3
)

// Config configures a Checkpointer, the part of a parameter server that snapshots its tables and
// persists them. The zero value of every optional field picks the default.
type Config struct {
	// Job names the training job. Required: 1-128 letters, digits, '.', '_' or '-'. It is the first
	// component of every storage name and of the shared-memory directory.
	Job string
	// Node names this parameter server. Required, same alphabet, not starting with '_'. It must be
	// stable across restarts on a host: a restarted process finds its shared-memory region by it.
	Node string
	// Tables are the tables to checkpoint, by name (same alphabet as Node). Fixed for the life of the
	// Checkpointer; may be empty for a node that saves only blobs.
	Tables map[string]Table
	// Storage is where checkpoints are persisted. Required.
	Storage Storage
	// Slots is S, the job's slot count (slot = xxhash64(id) mod S). Default 4096. Every node of a job
	// must use the same S; it is recorded in every manifest.
	Slots int
	// ShmDir is the directory of shared-memory regions; this node's region is ShmDir/Job/Node. Default
	// /dev/shm/elasticps. A directory on a disk file system works too (slower, and it survives reboots).
	ShmDir string
	// Codec compresses chunks in storage. Default CodecS2 (fast); CodecZstd saves more space for
	// several times the CPU; CodecNone stores raw records. A chunk the codec does not shrink by at
	// least an eighth (judged on its first 256 KiB) is stored raw whatever the codec.
	Codec Codec
	// FullEvery is K: every Kth checkpoint is a full base and the others are deltas holding only rows
	// changed since the previous checkpoint. Default 10; 1 makes every checkpoint full. A larger K
	// makes checkpoints cheaper but restores longer (base plus up to K-1 deltas) and makes each
	// shared-memory generation hold the base and all its deltas.
	FullEvery int
	// ChunkBytes is the target uncompressed size of a chunk (one slot range of one table). Default 32
	// MiB, minimum 4 KiB. Smaller chunks let a node that owns few slots read less on restore; larger
	// ones mean fewer objects.
	ChunkBytes int
	// Headroom is the extra fraction of shared memory allocated beyond the need when a generation
	// grows, so later deltas and table growth do not allocate (page-faulting memory on the blocking
	// path). Default 0.5 (the zero value); at most 8; negative means none.
	Headroom float64
	// Workers bounds the goroutines that checksum, compress and write (or read and decompress)
	// chunks. Default GOMAXPROCS.
	Workers int
	// Gate, if set, is shared with the other Checkpointers of this process: while any of them
	// copies for a Snapshot, the background work of all of them (checksums, persisting, growing
	// shared memory) waits, so it does not slow another's blocking copy. Default nil: a gate of
	// this Checkpointer's own, which holds its background work back during its own copies.
	Gate *CopyGate
	// Logger receives warnings (failed persists, skipped checkpoints). Nil discards.
	Logger *slog.Logger
	// OnPersist, if set, is called from the persister goroutine after each persist, successful or not.
	// It is not called for a snapshot that a Load or Restore abandoned, and never for a snapshot taken
	// before a Load or Restore once that call has begun changing the tables.
	// It must not block for long and must not call the Checkpointer.
	OnPersist func(PersistResult)
	// OnStorageVerified, if set, is called once a Load or Restore that read some node's part from
	// shared memory has checked, in the background, the storage copy of the same commit (every
	// chunk and blob this node would have read from storage): err is nil when it is intact, else
	// it wraps ErrCorrupt or ErrNotFound and names the object. A corrupt storage copy is logged as
	// a warning too: the restore itself was good, but a restore on another host would fail. It is
	// called from a background goroutine, must not block for long and must not call the
	// Checkpointer; it is not called if the Checkpointer is closed first.
	OnStorageVerified func(step uint64, err error)
}

// DefaultConfig returns a Config with the defaults filled in and the required fields (Job, Node,
// Storage, Tables) left for the caller.
func DefaultConfig() Config {
	return Config{
		Slots:      defaultSlots,
		ShmDir:     DefaultShmDir,
		Codec:      CodecS2,
		FullEvery:  DefaultFullEvery,
		ChunkBytes: DefaultChunkBytes,
		Headroom:   DefaultHeadroom,
		Workers:    runtime.GOMAXPROCS(0),
	}
}

// withDefaults returns c with zero optional fields replaced by defaults.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Slots == 0 {
		c.Slots = d.Slots
	}
	if c.ShmDir == "" {
		c.ShmDir = d.ShmDir
	}
	if c.FullEvery == 0 {
		c.FullEvery = d.FullEvery
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = d.ChunkBytes
	}
	if c.Headroom == 0 {
		c.Headroom = d.Headroom
	}
	if c.Workers == 0 {
		c.Workers = d.Workers
	}
	if c.Gate == nil {
		c.Gate = NewCopyGate()
	}
	return c
}

// Validate reports every problem of c at once (after defaults are applied).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !validIdent(c.Job) {
		bad("Job %q: want 1-128 letters, digits, '.', '_' or '-'", c.Job)
	}
	if !validIdent(c.Node) || c.Node[0] == '_' {
		bad("Node %q: want 1-128 letters, digits, '.', '_' or '-', not starting with '_'", c.Node)
	}
	for name, t := range c.Tables {
		if !validIdent(name) {
			bad("table name %q: want 1-128 letters, digits, '.', '_' or '-'", name)
		}
		if t == nil {
			bad("table %q is nil", name)
		} else if t.RawRowSize() < minRowSize {
			bad("table %q: raw row size %d is below %d", name, t.RawRowSize(), minRowSize)
		}
	}
	if c.Storage == nil {
		bad("Storage is required")
	}
	if c.Slots < 1 || c.Slots > maxSlots {
		bad("Slots %d: want 1..%d", c.Slots, maxSlots)
	}
	if !c.Codec.valid() {
		bad("Codec %v is unknown", c.Codec)
	}
	if c.FullEvery < 1 {
		bad("FullEvery %d: want >= 1", c.FullEvery)
	}
	if c.ChunkBytes < 4<<10 || c.ChunkBytes > 1<<30 {
		bad("ChunkBytes %d: want 4 KiB..1 GiB", c.ChunkBytes)
	}
	if c.Headroom > 8 || c.Headroom != c.Headroom {
		bad("Headroom %v: want at most 8", c.Headroom)
	}
	if c.Workers < 1 {
		bad("Workers %d: want >= 1", c.Workers)
	}
	if len(errs) > 0 {
		return fmt.Errorf("checkpoint: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

// CommitterConfig configures a Committer, the coordinator's side of the commit protocol.
type CommitterConfig struct {
	// Job names the training job. Required (same alphabet as Config.Job).
	Job string
	// Storage holds the job's checkpoints. Required.
	Storage Storage
	// KeepLast is how many of the newest commits retention keeps. Default 3; negative disables
	// automatic retention after Commit (Prune still uses the default). Retention also keeps one
	// commit that shares no object with the newest (see Prune), so a corrupt base of the newest
	// chain leaves a commit to restore whatever KeepLast is.
	KeepLast int
	// KeepEvery, when positive, also keeps every commit whose sequence number is a multiple of it
	// (every Mth commit), for long-range rollback. Default 0: none.
	KeepEvery int
	// Codec compresses the coordinator's blobs. Default CodecS2.
	Codec Codec
	// Logger receives warnings (skipped commits, retention problems). Nil discards.
	Logger *slog.Logger
}

// Validate reports every problem of c at once.
func (c CommitterConfig) Validate() error {
	var errs []error
	if !validIdent(c.Job) {
		errs = append(errs, fmt.Errorf("Job %q: want 1-128 letters, digits, '.', '_' or '-'", c.Job))
	}
	if c.Storage == nil {
		errs = append(errs, errors.New("Storage is required"))
	}
	if c.KeepEvery < 0 {
		errs = append(errs, fmt.Errorf("KeepEvery %d: want >= 0", c.KeepEvery))
	}
	if !c.Codec.valid() {
		errs = append(errs, fmt.Errorf("Codec %v is unknown", c.Codec))
	}
	if len(errs) > 0 {
		return fmt.Errorf("checkpoint: invalid committer config: %w", errors.Join(errs...))
	}
	return nil
}

func discardIfNil(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
