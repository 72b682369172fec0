package checkpoint

import (
	"context"
	"fmt"
)

// NodeBlobs returns the blobs the nodes' snapshots saved with the commit of step that keep
// accepts (nil: every one), read from storage in the commit's order of nodes. Each manifest is
// checked against the commit record and each blob against its checksum, as a restore does. A
// coordinator reads with it what the servers saved beside their rows (the batches each had
// applied, say) without a Checkpointer of its own.
func (m *Committer) NodeBlobs(ctx context.Context, step uint64, keep func(node, name string) bool) ([]NodeBlob, error) {
	rec, err := readCommit(ctx, m.cfg.Storage, m.cfg.Job, step)
	if err != nil {
		return nil, err
	}
	var out []NodeBlob
	for _, n := range rec.Nodes {
		b, err := getObject(ctx, m.cfg.Storage, n.Manifest, nil, int64(n.Size), 0)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Node, err)
		}
		if xxhashSum(b) != n.Sum {
			return nil, corruptf("node %s: manifest %s does not match the commit record", n.Node, n.Manifest)
		}
		man, err := decodeManifest(b)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Node, err)
		}
		if man.Job != rec.Job || man.Node != n.Node || man.Step != rec.Step {
			return nil, corruptf("node %s: manifest %s is for another checkpoint", n.Node, n.Manifest)
		}
		for _, br := range man.Blobs {
			if keep != nil && !keep(n.Node, br.Name) {
				continue
			}
			data, err := readBlob(ctx, m.cfg.Storage, man.dir()+"/"+br.Object, br, m.cs)
			if err != nil {
				return nil, fmt.Errorf("node %s: %w", n.Node, err)
			}
			out = append(out, NodeBlob{n.Node, Blob{br.Name, data}})
		}
	}
	return out, nil
}
