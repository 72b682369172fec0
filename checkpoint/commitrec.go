package checkpoint

import "fmt"

// A commit record is the second phase of a checkpoint: written by the coordinator after every node's
// manifest of the step is durable, it lists those manifests with their checksums and the coordinator's
// blobs. Only steps with a valid commit record are restored.
type commitRecord struct {
	Job     string
	Step    uint64
	Seq     uint64 // 1 + the Seq of the newest commit when this one was written
	Inc     uint64 // the incarnation of the coordinator that wrote it (Committer.Claim; 0: none)
	Slots   int
	Nodes   []commitNode
	BlobDir string // directory of Blobs ("" when there are none)
	Blobs   []blobRef
}

type commitNode struct {
	Node     string
	Manifest string // object name of the manifest
	Size     uint64
	Sum      uint64   // xxhash64 of the manifest object
	Segments []uint64 // the manifest's shared-memory segment chain
}

const (
	commitMagic   = "EPSCOMIT"
	commitVersion = 2 // 2 added Inc; version 1 records read with Inc 0
)

func appendCommit(dst []byte, c *commitRecord) []byte {
	e := encoder{b: append(dst, commitMagic...)}
	e.u32(commitVersion)
	e.str(c.Job)
	e.u64(c.Step)
	e.u64(c.Seq)
	e.u64(c.Inc)
	e.uv(uint64(c.Slots))
	e.uv(uint64(len(c.Nodes)))
	for _, n := range c.Nodes {
		e.str(n.Node)
		e.str(n.Manifest)
		e.u64(n.Size)
		e.u64(n.Sum)
		e.uv(uint64(len(n.Segments)))
		for _, s := range n.Segments {
			e.u64(s)
		}
	}
	e.str(c.BlobDir)
	appendBlobRefs(&e, c.Blobs)
	return e.seal()
}

func decodeCommit(src []byte) (*commitRecord, error) {
	d, v, err := openFileVersion(src, commitMagic, 1, commitVersion)
	if err != nil {
		return nil, err
	}
	c := &commitRecord{Job: d.str(), Step: d.u64(), Seq: d.u64()}
	if v >= 2 {
		c.Inc = d.u64()
	}
	slots := d.uv()
	if slots == 0 || slots > maxSlots {
		d.fail("slot count")
	}
	c.Slots = int(slots)
	nn := d.count(1 + 1 + 16 + 1)
	seen := map[string]bool{}
	for range nn {
		n := commitNode{Node: d.str(), Manifest: d.str(), Size: d.u64(), Sum: d.u64()}
		ns := d.count(8)
		for range ns {
			n.Segments = append(n.Segments, d.u64())
		}
		if d.err != nil {
			break
		}
		if !validIdent(n.Node) || seen[n.Node] || validName(n.Manifest) != nil || len(n.Segments) == 0 {
			d.fail("node entry")
			break
		}
		seen[n.Node] = true
		c.Nodes = append(c.Nodes, n)
	}
	c.BlobDir = d.str()
	c.Blobs = decodeBlobRefs(d)
	if err := d.done(); err != nil {
		return nil, fmt.Errorf("commit record: %w", err)
	}
	if !validIdent(c.Job) || len(c.Nodes) == 0 || (len(c.Blobs) > 0) != (c.BlobDir != "") ||
		(c.BlobDir != "" && validName(c.BlobDir) != nil) {
		return nil, corruptf("commit record: bad job %q, %d nodes or blob directory %q", c.Job, len(c.Nodes), c.BlobDir)
	}
	return c, nil
}
