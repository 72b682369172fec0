package elastic

import (
	"testing"

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
	assert.Equal(t, int64(10), checks[0].Violations())
	assert.Zero(t, checks[1].Violations())
	assert.True(t, checks[1].OK(), "epoch in progress, as counted")
	assert.False(t, checks[1].Complete)

	back, err := decodeLedger(l.encode())
	require.NoError(t, err)
	assert.Equal(t, checks, back.check([]epochTotals{{epoch: 0, records: 160, done: 160}, {epoch: 1, records: 160, done: 2}}, 1, false))

	missing := newLedger()
	missing.mark(0, 0, 159)
	c := missing.check([]epochTotals{{epoch: 0, records: 160, done: 160}}, 1, true)
	assert.False(t, c[0].OK(), "a position never trained fails a finished epoch")
	assert.Equal(t, int64(1), c[0].Violations(), "the lost position counts once")
	c = missing.check([]epochTotals{{epoch: 0, records: 160, done: 159}}, 1, true)
	assert.False(t, c[0].OK())
	assert.Equal(t, int64(1), c[0].Violations(), "lost with the dispatcher's agreement")
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
