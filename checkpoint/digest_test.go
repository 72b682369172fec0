package checkpoint_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
)

// digestTable returns a trained embedding table and its raw records.
func digestTable(t *testing.T, seed uint64) (*embedding.Table, []byte) {
	t.Helper()
	tab, err := embedding.New(embedding.Config{Name: "emb", Dim: 4, Seed: 9, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}})
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(seed, 1))
	for step := uint32(1); step <= 5; step++ {
		ids := make([]uint64, 50)
		for i := range ids {
			ids[i] = uint64(i*7) + uint64(step)
		}
		g := make([]float32, 4*len(ids))
		for i := range g {
			g[i] = float32(rng.NormFloat64())
		}
		require.NoError(t, tab.Apply(ids, g, step))
	}
	raw, _ := tab.AppendRawRows(nil, embedding.Cursor{}, math.MaxInt, nil)
	return tab, raw
}

func tableDigest(t *testing.T, tab *embedding.Table, raw []byte) checkpoint.Digest {
	t.Helper()
	td := checkpoint.TableDigest{Name: "emb", Schema: tab.Schema()}
	require.NoError(t, td.Add(raw, tab.RawRowSize()))
	return checkpoint.Digest{Tables: []checkpoint.TableDigest{td}}
}

// A digest is of the set of rows: any order, any split into parts that Merge adds up; and one
// bit of one weight changes it.
func TestDigestIsOfTheRowsNotTheirLayout(t *testing.T) {
	tab, raw := digestTable(t, 1)
	rec := tab.RawRowSize()
	whole := tableDigest(t, tab, raw)
	require.EqualValues(t, tab.Len(), whole.Tables[0].Rows)

	// The records in another order, split in three parts.
	n := len(raw) / rec
	perm := rand.New(rand.NewPCG(2, 2)).Perm(n)
	var parts [3][]byte
	for i, p := range perm {
		parts[i%3] = append(parts[i%3], raw[p*rec:(p+1)*rec]...)
	}
	var ds []checkpoint.Digest
	for _, p := range parts {
		ds = append(ds, tableDigest(t, tab, p))
	}
	merged, err := checkpoint.Merge(ds...)
	require.NoError(t, err)
	assert.True(t, whole.Equal(merged), "%v", whole.Diff(merged))
	assert.NoError(t, whole.Compare(merged))

	// One bit of one weight (the lowest of the mantissa, past the 16-byte header) of one row.
	for _, row := range []int{0, n / 2, n - 1} {
		flipped := append([]byte(nil), raw...)
		flipped[row*rec+16] ^= 1
		d := tableDigest(t, tab, flipped)
		assert.False(t, whole.Equal(d), "row %d", row)
		assert.ErrorIs(t, whole.Compare(d), checkpoint.ErrDigestMismatch)
		assert.Equal(t, []string{"table emb: 250 rows each, their values differ"}, whole.Diff(d))
	}

	// A row fewer, a table more, another schema.
	assert.Equal(t, []string{"table emb: 250 rows, 249"}, whole.Diff(tableDigest(t, tab, raw[rec:])))
	other := checkpoint.Digest{Tables: append(whole.Tables, checkpoint.TableDigest{Name: "z"})}
	assert.Equal(t, []string{"table z: only in the second"}, whole.Diff(other))
	_, err = checkpoint.Merge(whole, checkpoint.Digest{Tables: []checkpoint.TableDigest{{Name: "emb", Schema: []byte("x")}}})
	assert.ErrorIs(t, err, checkpoint.ErrDigestMismatch)
}

func TestDigestRefusesWhatIsNotRows(t *testing.T) {
	tab, raw := digestTable(t, 1)
	rec := tab.RawRowSize()
	td := checkpoint.TableDigest{Name: "emb"}
	assert.ErrorIs(t, td.Add(raw[:rec+1], rec), checkpoint.ErrCorrupt)
	del := append([]byte(nil), raw[:2*rec]...)
	binary.LittleEndian.PutUint32(del[rec+8:], checkpoint.DeletionMark)
	assert.ErrorIs(t, td.Add(del, rec), checkpoint.ErrCorrupt)
	assert.Zero(t, td.Rows, "nothing counted")
}

func TestDigestEncoding(t *testing.T) {
	tab, raw := digestTable(t, 3)
	d := tableDigest(t, tab, raw)
	d.Step = 42
	d.Tables = append(d.Tables, checkpoint.TableDigest{Name: "dense", Schema: []byte{1}, Rows: 2, Sum: [2]uint64{3, 4}})
	b := checkpoint.AppendDigest([]byte("head"), d)
	got, rest, err := checkpoint.DecodeDigest(append(b[4:], "tail"...))
	require.NoError(t, err)
	assert.Equal(t, d, got)
	assert.Equal(t, "tail", string(rest))

	b = b[4:]
	for i := range b {
		bad := append([]byte(nil), b...)
		bad[i] ^= 0x10
		_, _, err := checkpoint.DecodeDigest(bad)
		assert.Error(t, err, "byte %d", i)
	}
	_, _, err = checkpoint.DecodeDigest(b[:len(b)-1])
	assert.ErrorIs(t, err, checkpoint.ErrCorrupt)
}

func FuzzDecodeDigest(f *testing.F) {
	f.Add(checkpoint.AppendDigest(nil, checkpoint.Digest{Step: 3, Tables: []checkpoint.TableDigest{{Name: "a", Schema: []byte("s"), Rows: 1, Sum: [2]uint64{5, 6}}}}))
	f.Add([]byte("EPSDIGST"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, rest, err := checkpoint.DecodeDigest(b)
		if err != nil {
			return
		}
		// What decodes encodes to the bytes it was read from.
		assert.Equal(t, b[:len(b)-len(rest)], checkpoint.AppendDigest(nil, d))
	})
}
