package train

import (
	"testing"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLedgerCountsAndRoundTrips(t *testing.T) {
	l := newLedger()
	l.mark(0, 0, 100)
	l.mark(0, 100, 150)
	l.mark(0, 140, 160) // 10 positions twice
	l.mark(1, 5, 7)
	checks := l.check([]epochTotals{{epoch: 0, records: 160, done: 160}, {epoch: 1, records: 160, done: 2}}, 1, false)
	require.Len(t, checks, 2)
	assert.Equal(t, int64(160), checks[0].Covered)
	assert.Equal(t, int64(10), checks[0].Duplicates)
	assert.Equal(t, int64(140), checks[0].FirstDuplicate)
	assert.True(t, checks[0].Complete)
	assert.False(t, checks[0].OK(), "duplicates fail the check")
	assert.True(t, checks[1].OK(), "epoch in progress, as counted")
	assert.False(t, checks[1].Complete)

	back, err := decodeLedger(l.encode())
	require.NoError(t, err)
	assert.Equal(t, checks, back.check([]epochTotals{{epoch: 0, records: 160, done: 160}, {epoch: 1, records: 160, done: 2}}, 1, false))

	missing := newLedger()
	missing.mark(0, 0, 159)
	c := missing.check([]epochTotals{{epoch: 0, records: 160, done: 160}}, 1, true)
	assert.False(t, c[0].OK(), "a position never trained fails a finished epoch")
}

func FuzzDecodeLedger(f *testing.F) {
	l := newLedger()
	l.mark(0, 0, 70)
	l.mark(3, 10, 11)
	l.mark(3, 10, 11)
	f.Add(l.encode())
	f.Add(newLedger().encode())
	f.Add([]byte(ledgerMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeLedger(b)
		if err != nil {
			assert.ErrorIs(t, err, errLedger)
			return
		}
		again, err := decodeLedger(got.encode())
		require.NoError(t, err)
		assert.Equal(t, got.encode(), again.encode())
	})
}

func TestDenseBlobRoundTrips(t *testing.T) {
	opt := embedding.Optimizer{Kind: embedding.Adam, LearningRate: 0.003}
	srv, err := ps.NewServer(ps.ServerConfig{ID: "ps-0", Secret: []byte("s"), Tables: []ps.TableSpec{{Name: "emb.a", Config: embedding.Config{Dim: 4}}}})
	require.NoError(t, err)
	defer srv.Close()
	// Without an owner table and a client the server hosts no dense tensor: the blob is empty.
	b, err := encodeDense(srv)
	require.NoError(t, err)
	entries, err := decodeDense(b)
	require.NoError(t, err)
	assert.Empty(t, entries)

	tab, err := embedding.New(embedding.Config{Dim: 3, Optimizer: opt})
	require.NoError(t, err)
	require.NoError(t, tab.Assign([]uint64{0, 1}, []float32{1, 2, 3, 4, 5, 6}))
	raw := make([]byte, tab.RawSize(false))
	n, err := tab.CopyRaw(raw, false, false)
	require.NoError(t, err)
	in := []denseEntry{{name: "mlp.top.0.weight", length: 5, opt: tab.Config().Optimizer, schema: tab.Schema(), raw: raw[:n]}}
	blob := appendDense(nil, in)
	out, err := decodeDense(blob)
	require.NoError(t, err)
	assert.Equal(t, in, out)
}

func FuzzDecodeDense(f *testing.F) {
	f.Add(appendDense(nil, []denseEntry{{name: "mlp.x", length: 3, opt: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 1}, schema: []byte("s"), raw: []byte{1, 2, 3}}}))
	f.Add(appendDense(nil, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeDense(b)
		if err != nil {
			assert.ErrorIs(t, err, errDenseBlob)
			return
		}
		again, err := decodeDense(appendDense(nil, got))
		require.NoError(t, err)
		assert.Equal(t, appendDense(nil, got), appendDense(nil, again))
	})
}
