package elastic

import (
	"context"

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
	// persisting to storage goes on in the background.
	Snapshot(ctx context.Context, step uint64) (checkpoint.SnapshotInfo, error)
	// WaitPersisted waits until the snapshot of step is in storage and returns its manifest.
	WaitPersisted(ctx context.Context, step uint64) (checkpoint.ManifestRef, error)
	// Verify checks that the commit of step can be loaded for the slots t gives this server.
	Verify(ctx context.Context, step uint64, t *ps.OwnerTable) error
	// Load restores the state of step for the slots t gives this server.
	Load(ctx context.Context, step uint64, t *ps.OwnerTable) error
}
