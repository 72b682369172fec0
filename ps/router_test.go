package ps

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func nodes(n int) []Node {
	ns := make([]Node, n)
	for i := range ns {
		ns[i] = Node{ID: fmt.Sprintf("ps-%d", i), Addr: fmt.Sprintf("10.0.0.%d:7000", i)}
	}
	return ns
}

func moved(a, b *OwnerTable) float64 { return float64(len(a.Moves(b))) / float64(a.Slots) }

// TestOwnerTableGrowAndShrink checks, for n = 1..64 servers, the load bound, that adding one
// server moves about 1/(n+1) of the slots, and that removing one moves only its own slots.
func TestOwnerTableGrowAndShrink(t *testing.T) {
	const S = DefaultSlots
	worst := 0.0
	for n := 1; n <= 64; n++ {
		a, err := NewOwnerTable(1, S, nodes(n), nil)
		require.NoError(t, err)
		assert.LessOrEqual(t, a.MaxOverAvgLoad(), LoadBound+1e-9, "n=%d", n)
		b, err := NewOwnerTable(2, S, nodes(n+1), a)
		require.NoError(t, err)
		assert.LessOrEqual(t, b.MaxOverAvgLoad(), LoadBound+1e-9, "n=%d", n+1)
		f := moved(a, b)
		ideal := 1 / float64(n+1)
		worst = max(worst, f/ideal)
		assert.InDelta(t, ideal, f, 0.3*ideal+0.005, "adding a server to %d", n)
		toNew := 0
		for _, m := range a.Moves(b) {
			if m.To == fmt.Sprintf("ps-%d", n) {
				toNew++
			}
		}
		// The rest are slots the tighter load bound pushes between the old servers.
		assert.GreaterOrEqual(t, float64(toNew), 0.8*float64(len(a.Moves(b))), "n=%d", n)
		// Remove a random server from b: only its slots move.
		gone := rand.New(rand.NewPCG(uint64(n), 9)).IntN(n + 1)
		rest := append(nodes(n + 1)[:gone:gone], nodes(n + 1)[gone+1:]...)
		c, err := NewOwnerTable(3, S, rest, b)
		require.NoError(t, err)
		for _, m := range b.Moves(c) {
			assert.Equal(t, fmt.Sprintf("ps-%d", gone), m.From, "removing ps-%d from %d moved slot %d of %s", gone, n+1, m.Slot, m.From)
		}
		assert.LessOrEqual(t, c.MaxOverAvgLoad(), LoadBound+1e-9)
	}
	t.Logf("worst moved fraction over the ideal 1/(n+1): %.3f", worst)
}

func TestOwnerTableDeterministicAndWeighted(t *testing.T) {
	ns := nodes(5)
	a, _ := NewOwnerTable(1, 1000, ns, nil)
	rev := append([]Node(nil), ns...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	b, _ := NewOwnerTable(1, 1000, rev, nil)
	assert.Empty(t, a.Moves(b), "node order does not matter")
	ns[0].Weight = 3
	w, _ := NewOwnerTable(1, 1000, ns, nil)
	loads := w.Loads()
	assert.InDelta(t, 3.0/7*1000, loads[0], 30)
	assert.InDelta(t, 1.0/7*1000, loads[1], 30)
}

func TestOwnerTableRejectsBadInput(t *testing.T) {
	_, err := NewOwnerTable(1, 0, nil, nil)
	require.ErrorIs(t, err, ErrBadConfig)
	_, err = NewOwnerTable(1, 16, []Node{{ID: "a"}, {ID: "a"}, {ID: ""}, {ID: "b", Weight: -1}}, nil)
	require.ErrorIs(t, err, ErrBadConfig)
	for _, want := range []string{"twice", "no ID", "weight"} {
		assert.Contains(t, err.Error(), want)
	}
	a, _ := NewOwnerTable(1, 16, nodes(2), nil)
	_, err = NewOwnerTable(2, 32, nodes(2), a)
	require.ErrorIs(t, err, ErrBadConfig)
}

func TestOwnerTableEncoding(t *testing.T) {
	a, err := NewOwnerTable(7, 300, nodes(4), nil)
	require.NoError(t, err)
	b := AppendOwnerTable([]byte("x"), a)
	got, rest, err := DecodeOwnerTable(append(b[1:], 'y'))
	require.NoError(t, err)
	assert.Equal(t, []byte("y"), rest)
	assert.Equal(t, a, got)
	for i := range b[1:] {
		bad := append([]byte(nil), b[1:]...)
		bad[i] ^= 1
		_, _, err := DecodeOwnerTable(bad)
		require.ErrorIs(t, err, ErrCorrupt, "flip at %d", i)
	}
}

func FuzzDecodeOwnerTable(f *testing.F) {
	a, _ := NewOwnerTable(3, 40, nodes(3), nil)
	f.Add(AppendOwnerTable(nil, a))
	f.Add([]byte("EPSO"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, _, err := DecodeOwnerTable(b)
		if err != nil {
			return
		}
		for s := 0; s < tab.Slots; s++ {
			_ = tab.Owner(s) // every owner index is valid
		}
		again, _, err := DecodeOwnerTable(AppendOwnerTable(nil, tab))
		if err != nil || again.Version != tab.Version || len(again.Moves(tab)) != 0 {
			t.Fatalf("re-encoding changed the table: %v", err)
		}
	})
}

func FuzzDecodeTableReq(f *testing.F) {
	f.Add(appendTableReq(nil, &tableReq{version: 1, dim: 2, table: "t"}, []uint64{1, 2}, []float32{1, 2, 3, 4}, 0))
	f.Add(appendTableReq(nil, &tableReq{table: "dense"}, nil, []float32{1}, 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, ids := range []bool{true, false} {
			r, err := decodeTableReq(b, ids)
			if err == nil && len(r.floats)%4 != 0 {
				t.Fatal("accepted a partial float")
			}
		}
	})
}
