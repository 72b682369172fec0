package checkpoint

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func sampleManifest() *manifest {
	owned := newSlotSet(70)
	owned.add(3)
	owned.add(69)
	kept := newSlotSet(70) // slot 69 was gained after the parent's step: its older rows are dropped
	kept.add(3)
	return &manifest{Job: "job", Node: "ps-1", Step: 20, ID: 0xabc, Slots: 70, Owned: owned, Kept: kept, Full: false,
		BaseStep: 10, Parent: "job/data/00000000000000000010/ps-1/0000000000000001/manifest", ParentStep: 10,
		Segments: []uint64{1, 2},
		Tables: []manifestTable{{Name: "t", Schema: []byte{1, 2}, RowSize: 16, Records: 3, Chunks: []chunkRef{
			{Object: "t0-s0-p0", SlotLo: 0, SlotHi: 10, Records: 1, RawLen: 16, Size: 90, Sum: 7},
			{Object: "t0-s10-p0", SlotLo: 10, SlotHi: 70, Records: 2, RawLen: 32, Size: 100, Sum: 8}}}},
		Blobs: []blobRef{{Name: "dense", Object: "b0", RawLen: 4, Size: 80, Sum: 9}}}
}

func FuzzDecodeChunk(f *testing.F) {
	cs := newCodecs(1)
	raw := bytes.Repeat([]byte("0123456789abcdef"), 64)
	for _, codec := range []Codec{CodecS2, CodecZstd, CodecNone} {
		f.Add(appendChunk(nil, chunkInfo{kind: chunkKindRows, rowSize: 16, slotLo: 1, slotHi: 9, records: 64}, raw, codec, cs))
		f.Add(appendChunk(nil, chunkInfo{kind: chunkKindBlob}, raw[:100], codec, cs))
	}
	f.Add([]byte("EPSCHUNK"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ci, out, err := decodeChunk(b, nil, 1<<20, cs)
		if err != nil {
			assertUnreadable(t, err)
			return
		}
		// A chunk that decodes re-encodes (uncompressed) to one that decodes to the same bytes.
		again := appendChunk(nil, ci, out, CodecNone, cs)
		ci2, out2, err := decodeChunk(again, nil, 1<<20, cs)
		require.NoError(t, err)
		assert.Equal(t, out, out2)
		ci.codec, ci2.codec, ci.rawSum, ci2.rawSum = 0, 0, 0, 0
		assert.Equal(t, ci, ci2)
	})
}

// appendManifestV1 encodes m as version 1 wrote manifests: no kept slots.
func appendManifestV1(m *manifest) []byte {
	b := appendManifest(nil, m)
	d, _, err := openFileVersion(b, manifestMagic, manifestVersion, manifestVersion)
	if err != nil {
		panic(err)
	}
	// Everything up to the kept slots, then everything after them.
	e := encoder{b: []byte(manifestMagic)}
	e.u32(1)
	e.str(d.str())
	e.str(d.str())
	e.u64(d.u64())
	e.u64(d.u64())
	e.slots(d.slots())
	d.slots()
	e.b = append(e.b, d.b...)
	return e.seal()
}

// Manifests written before they recorded kept slots are still read, as keeping the owned ones
// (their chains never change slots).
func TestVersion1ManifestIsStillRead(t *testing.T) {
	m := sampleManifest()
	m.Kept = m.Owned
	got, err := decodeManifest(appendManifestV1(m))
	require.NoError(t, err)
	assert.Equal(t, m, got)
	assert.Equal(t, m.Owned, got.Kept)
}

// A manifest's kept slots are a subset of its owned ones, and all of them in a full manifest.
func TestManifestKeptSlotsAreChecked(t *testing.T) {
	m := sampleManifest()
	_, err := decodeManifest(appendManifest(nil, m))
	require.NoError(t, err)
	bad := sampleManifest()
	bad.Kept.add(10)
	_, err = decodeManifest(appendManifest(nil, bad))
	require.ErrorIs(t, err, ErrCorrupt)
	full := sampleManifest()
	full.Full, full.Parent, full.ParentStep, full.BaseStep = true, "", 0, 20
	_, err = decodeManifest(appendManifest(nil, full))
	require.ErrorIs(t, err, ErrCorrupt, "a full manifest keeps every slot it owns")
	full.Kept = full.Owned
	_, err = decodeManifest(appendManifest(nil, full))
	require.NoError(t, err)
}

func FuzzDecodeManifest(f *testing.F) {
	m := sampleManifest()
	full := sampleManifest()
	full.Full, full.Parent, full.ParentStep, full.BaseStep, full.Kept = true, "", 0, 20, full.Owned
	for _, seed := range [][]byte{appendManifest(nil, m), appendManifestV1(m), appendManifest(nil, full), appendManifestV1(full)} {
		_, err := decodeManifest(seed)
		require.NoError(f, err, "a seed decodes")
		f.Add(seed)
	}
	f.Add([]byte("EPSMANIF\x02\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		// As mutated, and with its trailer made right, so that the body's decoding is reached.
		for _, b := range [][]byte{b, withTrailer(b)} {
			m, err := decodeManifest(b)
			if err != nil {
				assertUnreadable(t, err)
				continue
			}
			m2, err := decodeManifest(appendManifest(nil, m))
			require.NoError(t, err)
			assert.Equal(t, m, m2)
		}
	})
}

func FuzzDecodeCommit(f *testing.F) {
	rec := &commitRecord{Job: "job", Step: 5, Seq: 2, Slots: 4096,
		Nodes: []commitNode{{Node: "a", Manifest: "job/data/x/a/1/manifest", Size: 10, Sum: 3, Segments: []uint64{1}},
			{Node: "b", Manifest: "job/data/x/b/1/manifest", Size: 11, Sum: 4, Segments: []uint64{5, 6}}},
		BlobDir: "job/data/x/_coordinator/2", Blobs: []blobRef{{Name: "state", Object: "b0", RawLen: 3, Size: 80, Sum: 1}}}
	f.Add(appendCommit(nil, rec))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeCommit(b)
		if err != nil {
			assertUnreadable(t, err)
			return
		}
		rec2, err := decodeCommit(appendCommit(nil, rec))
		require.NoError(t, err)
		assert.Equal(t, rec, rec2)
	})
}

// withTrailer returns b with its last 8 bytes replaced by the xxhash64 of the rest (b as it is
// when shorter than a trailer): a mutated file whose checksum still holds.
func withTrailer(b []byte) []byte {
	if len(b) < 8 {
		return b
	}
	out := append([]byte(nil), b[:len(b)-8]...)
	return binary.LittleEndian.AppendUint64(out, xxhashSum(out))
}

// withVersion returns the file b (magic, version, ..., xxhash64 trailer) relabelled as version v.
func withVersion(b []byte, v uint32) []byte {
	out := append([]byte(nil), b[:len(b)-8]...)
	binary.LittleEndian.PutUint32(out[8:], v)
	return binary.LittleEndian.AppendUint64(out, xxhashSum(out))
}

func FuzzDecodeSeal(f *testing.F) {
	s := &sealFile{Job: "job", Node: "n", Gen: 1, Slots: 8, Piece: sealPiece,
		Extents: []extentRef{{Name: "g1-0", Size: 1 << 20}, {Name: "g1-3", Size: 1 << 21}},
		Segments: []*segment{
			{ID: 1, Step: 10, Full: true, BaseStep: 10, Owned: allSlots(8),
				Tables: []segTable{{Name: "t", Schema: []byte("s"), RowSize: 16, Extent: 0, Off: 64, Len: 160, Sums: []uint64{42}}},
				Blobs:  []segBlob{{Name: "d", Extent: 1, Off: 0, Len: 3, Sum: 5}}},
			{ID: 2, Step: 11, BaseStep: 10, Owned: allSlots(8),
				Tables: []segTable{{Name: "t", Schema: []byte("s"), RowSize: 16, Extent: 1, Off: 64, Len: 0, Sums: []uint64{}}}},
		}}
	seeds := [][]byte{appendSeal(nil, s), withVersion(appendSeal(nil, s), 2)}
	// A chain whose slots change: the node loses slots 1 and 5, then gains slot 5 back.
	lost, back := allSlots(8), allSlots(8)
	lost.bits[0] &^= 1<<1 | 1<<5
	back.bits[0] &^= 1 << 1
	s.Segments = append(s.Segments,
		&segment{ID: 3, Step: 12, BaseStep: 10, Owned: lost,
			Tables: []segTable{{Name: "t", Schema: []byte("s"), RowSize: 16, Extent: 1, Off: 128, Len: 32, WholeRecords: true, Sums: []uint64{7}}}},
		&segment{ID: 4, Step: 13, BaseStep: 10, Owned: back,
			Tables: []segTable{{Name: "t", Schema: []byte("s"), RowSize: 16, Extent: 1, Off: 4096, Len: 48, WholeRecords: true, Sums: []uint64{8}}}})
	seeds = append(seeds, appendSeal(nil, s))
	for _, seed := range seeds {
		_, err := decodeSeal(seed)
		require.NoError(f, err, "a seed decodes")
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// As mutated, and with its trailer made right, so that the body's decoding is reached.
		for _, b := range [][]byte{b, withTrailer(b)} {
			s, err := decodeSeal(b)
			if err != nil {
				assertUnreadable(t, err)
				continue
			}
			s2, err := decodeSeal(appendSeal(nil, s))
			require.NoError(t, err)
			assert.Equal(t, s, s2)
		}
	})
}

func TestCodecRoundTripAndRatio(t *testing.T) {
	cs := newCodecs(2)
	raw := bytes.Repeat([]byte("embedding rows compress "), 1000)
	for _, codec := range []Codec{CodecS2, CodecZstd, CodecNone} {
		file := appendChunk(nil, chunkInfo{kind: chunkKindBlob}, raw, codec, cs)
		ci, out, err := decodeChunk(file, nil, len(raw), cs)
		require.NoError(t, err)
		assert.Equal(t, raw, out)
		assert.Equal(t, codec, ci.codec)
		if codec != CodecNone {
			assert.Less(t, len(file), len(raw)/4, codec.String())
		}
		_, _, err = decodeChunk(file, nil, len(raw)-1, cs)
		assert.ErrorIs(t, err, ErrCorrupt, "a chunk larger than the caller allows")
	}
	// Incompressible data is stored as it is.
	noise := make([]byte, 4096)
	for i := range noise {
		noise[i] = byte(i*7919 + i*i*31)
	}
	file := appendChunk(nil, chunkInfo{kind: chunkKindBlob}, noise, CodecS2, cs)
	ci, _, err := checkChunk(file)
	require.NoError(t, err)
	assert.LessOrEqual(t, len(file), len(noise)+chunkHeader+8)
	_ = ci
}

// A seal of a chain whose segments own the same slots is written as version 2, which an earlier
// release reads; a chain whose slots change is version 3, which such a release refuses.
func TestSealVersionFollowsSlotChanges(t *testing.T) {
	seg := func(id uint64, owned slotSet) *segment {
		return &segment{ID: id, Step: 10 + id, Full: id == 1, BaseStep: 11, Owned: owned,
			Tables: []segTable{{Name: "t", Schema: []byte("s"), RowSize: 16, Extent: 0, Off: 64 * id, Len: 0, Sums: []uint64{}}}}
	}
	s := &sealFile{Job: "job", Node: "n", Gen: 1, Slots: 8, Piece: sealPiece, Extents: []extentRef{{Name: "g1-0", Size: 1 << 20}},
		Segments: []*segment{seg(1, allSlots(8)), seg(2, allSlots(8))}}
	version := func(b []byte) uint32 { return binary.LittleEndian.Uint32(b[len(sealMagic):]) }
	b := appendSeal(nil, s)
	assert.Equal(t, uint32(2), version(b))
	_, _, err := openFileVersion(b, sealMagic, 1, 2)
	require.NoError(t, err, "a reader of versions 1 and 2 opens it")
	fewer := allSlots(8)
	fewer.bits[0] &^= 1 << 3
	s.Segments = append(s.Segments, seg(3, fewer))
	b = appendSeal(nil, s)
	assert.Equal(t, uint32(3), version(b))
	got, err := decodeSeal(b)
	require.NoError(t, err)
	assert.Equal(t, s, got)
}

// assertUnreadable checks that a decoder refused its input as corrupt or as too new.
func assertUnreadable(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrUnsupportedVersion) {
		assert.ErrorIs(t, err, ErrCorrupt)
	}
}

// A file of a later format version is refused as such, not as corruption: a restore must not
// skip the commit, nor retention delete what it refers to.
func TestNewerVersionIsNotCorruption(t *testing.T) {
	b := withVersion(appendManifest(nil, sampleManifest()), manifestVersion+1)
	_, err := decodeManifest(b)
	require.ErrorIs(t, err, ErrUnsupportedVersion)
	assert.NotErrorIs(t, err, ErrCorrupt)
	assert.False(t, skippable(err))
	_, err = decodeManifest(withVersion(appendManifest(nil, sampleManifest()), 0))
	assert.ErrorIs(t, err, ErrCorrupt, "a version below the first is corrupt")
}
