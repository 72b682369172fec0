package checkpoint

import (
	"fmt"
	"slices"
)

// A manifest describes one node's checkpoint at one step: its slot set, its tables and their chunks, its
// blobs, and for a delta the manifest it applies on top of. It is written after every object it names
// is durable, so a readable manifest means a whole node checkpoint.
//
// The rows of a chain: a manifest's chunks hold rows of its Owned slots only; a row of manifest k
// survives in the chain only if its slot is in Kept of every later manifest. Kept is the slots
// owned at every snapshot a delta carries since its parent (Owned, unless the delta carries
// several snapshots and the slot set changed between them), so the rows of a slot lost since
// are dropped without deletion records, and a slot lost and owned again comes back only through
// the whole copy of its rows taken when it was gained again (see Snapshot). Version 1 manifests
// have no Kept: their chains own one slot set throughout, and Kept reads as Owned.
type manifest struct {
	Job, Node  string
	Step       uint64
	ID         uint64 // unique per persist attempt; names the directory
	Slots      int    // S of the job
	Owned      slotSet
	Kept       slotSet // subset of Owned; equal to it in a full manifest
	Full       bool
	BaseStep   uint64   // step of the full checkpoint the chain starts at
	Parent     string   // name of the parent manifest, delta only
	ParentStep uint64   // delta only
	Segments   []uint64 // shared-memory segment ids from the base through Step
	Tables     []manifestTable
	Blobs      []blobRef
}

type manifestTable struct {
	Name    string
	Schema  []byte
	RowSize uint32
	Records uint64
	Chunks  []chunkRef
}

// chunkRef names one chunk object (relative to the manifest's directory) and what it must hold.
type chunkRef struct {
	Object         string
	SlotLo, SlotHi uint32
	Part           uint32
	Records        uint64
	RawLen         uint64
	Size           uint64 // stored bytes
	Sum            uint64 // xxhash64 of the stored object
}

// blobRef names one stored blob. Object is relative to the directory of the manifest or commit record
// that lists it.
type blobRef struct {
	Name   string
	Object string
	RawLen uint64
	Size   uint64
	Sum    uint64
}

const (
	manifestMagic = "EPSMANIF"
	// manifestVersion is written for a chain whose slot set changes; version 1 (no Kept) for a
	// chain that keeps its slots, so that a reader of version 1 (an earlier release) still
	// restores and keeps what it can read right. Both are read.
	manifestVersion = 2
)

func (m *manifest) dir() string { return persistDir(m.Job, m.Step, m.Node, m.ID) }

// appendManifest encodes m at manifestVersion.
func appendManifest(dst []byte, m *manifest) []byte {
	return appendManifestVersion(dst, m, manifestVersion)
}

// appendManifestVersion encodes m at version (1 or 2); version 1 has no Kept (a reader takes it
// to be Owned).
func appendManifestVersion(dst []byte, m *manifest, version uint32) []byte {
	e := encoder{b: append(dst, manifestMagic...)}
	e.u32(version)
	e.str(m.Job)
	e.str(m.Node)
	e.u64(m.Step)
	e.u64(m.ID)
	e.slots(m.Owned)
	if version >= 2 {
		e.slots(m.Kept)
	}
	e.bool(m.Full)
	e.u64(m.BaseStep)
	e.str(m.Parent)
	e.u64(m.ParentStep)
	e.uv(uint64(len(m.Segments)))
	for _, s := range m.Segments {
		e.u64(s)
	}
	e.uv(uint64(len(m.Tables)))
	for _, t := range m.Tables {
		e.str(t.Name)
		e.bytes(t.Schema)
		e.u32(t.RowSize)
		e.u64(t.Records)
		e.uv(uint64(len(t.Chunks)))
		for _, c := range t.Chunks {
			e.str(c.Object)
			e.u32(c.SlotLo)
			e.u32(c.SlotHi)
			e.u32(c.Part)
			e.u64(c.Records)
			e.u64(c.RawLen)
			e.u64(c.Size)
			e.u64(c.Sum)
		}
	}
	appendBlobRefs(&e, m.Blobs)
	return e.seal()
}

func appendBlobRefs(e *encoder, blobs []blobRef) {
	e.uv(uint64(len(blobs)))
	for _, b := range blobs {
		e.str(b.Name)
		e.str(b.Object)
		e.u64(b.RawLen)
		e.u64(b.Size)
		e.u64(b.Sum)
	}
}

func decodeBlobRefs(d *decoder) []blobRef {
	n := d.count(1 + 1 + 24)
	blobs := make([]blobRef, 0, n)
	names := map[string]bool{}
	for range n {
		b := blobRef{Name: d.str(), Object: d.str(), RawLen: d.u64(), Size: d.u64(), Sum: d.u64()}
		if d.err != nil {
			break
		}
		if !validIdent(b.Name) || names[b.Name] || validName(b.Object) != nil {
			d.fail("blob entry")
			break
		}
		names[b.Name] = true
		blobs = append(blobs, b)
	}
	return blobs
}

// decodeManifest decodes and validates a manifest file.
func decodeManifest(src []byte) (*manifest, error) {
	d, version, err := openFileVersion(src, manifestMagic, 1, manifestVersion)
	if err != nil {
		return nil, err
	}
	m := &manifest{Job: d.str(), Node: d.str(), Step: d.u64(), ID: d.u64()}
	m.Owned = d.slots()
	m.Slots = m.Owned.n
	if version >= 2 {
		m.Kept = d.slots()
	} else {
		m.Kept = slotSet{n: m.Owned.n, bits: slices.Clone(m.Owned.bits)}
	}
	m.Full = d.bool()
	m.BaseStep = d.u64()
	m.Parent = d.str()
	m.ParentStep = d.u64()
	ns := d.count(8)
	for range ns {
		m.Segments = append(m.Segments, d.u64())
	}
	nt := d.count(1 + 1 + 4 + 8 + 1)
	for range nt {
		t := manifestTable{Name: d.str(), Schema: d.bytes(), RowSize: d.u32(), Records: d.u64()}
		nc := d.count(1 + 12 + 32)
		var total uint64
		for range nc {
			c := chunkRef{Object: d.str(), SlotLo: d.u32(), SlotHi: d.u32(), Part: d.u32(),
				Records: d.u64(), RawLen: d.u64(), Size: d.u64(), Sum: d.u64()}
			if d.err != nil {
				break
			}
			if validName(c.Object) != nil || c.SlotLo >= c.SlotHi || int64(c.SlotHi) > int64(m.Slots) ||
				c.Records > c.RawLen || c.Records*uint64(t.RowSize) != c.RawLen || c.Size < chunkHeader+8 {
				d.fail("chunk entry")
				break
			}
			total += c.Records
			t.Chunks = append(t.Chunks, c)
		}
		if d.err != nil {
			break
		}
		if t.RowSize < minRowSize || total != t.Records {
			d.fail("table entry")
			break
		}
		m.Tables = append(m.Tables, t)
	}
	m.Blobs = decodeBlobRefs(d)
	if err := d.done(); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// validate checks the cross-field rules a decoded manifest must satisfy.
func (m *manifest) validate() error {
	switch {
	case !validIdent(m.Job) || !validIdent(m.Node):
		return corruptf("manifest: bad job %q or node %q", m.Job, m.Node)
	case m.Full && (m.Parent != "" || m.BaseStep != m.Step):
		return corruptf("manifest: full checkpoint with a parent")
	case !m.Full && (validName(m.Parent) != nil || m.ParentStep >= m.Step || m.BaseStep > m.ParentStep):
		return corruptf("manifest: delta with bad parent %q at step %d", m.Parent, m.ParentStep)
	case len(m.Segments) == 0:
		return corruptf("manifest: no segments")
	case m.Kept.n != m.Owned.n || !m.Kept.subsetOf(m.Owned) || (m.Full && !m.Kept.equal(m.Owned)):
		return corruptf("manifest: kept slots are not the owned slots or a subset of them")
	}
	names := map[string]bool{}
	for _, t := range m.Tables {
		if !validIdent(t.Name) || names[t.Name] {
			return corruptf("manifest: bad or repeated table name %q", t.Name)
		}
		names[t.Name] = true
	}
	return nil
}

func (m *manifest) table(name string) *manifestTable {
	for i := range m.Tables {
		if m.Tables[i].Name == name {
			return &m.Tables[i]
		}
	}
	return nil
}
