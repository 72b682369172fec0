package ps

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rowsOfTable returns every row of tab by id.
func rowsOfTable(tab *embedding.Table) map[uint64]embedding.RowData {
	out := map[uint64]embedding.RowData{}
	tab.Range(func(v embedding.RowView) bool {
		out[v.ID] = embedding.RowData{ID: v.ID, Weights: append([]float32(nil), v.Weights...), State: append([]float32(nil), v.State...), LastStep: v.LastStep, Freq: v.Freq}
		return true
	})
	return out
}

// A positioned push whose apply failed (a NaN gradient, which a Client never sends but a
// server must survive) applied nothing, so the position is not recorded as applied: the same
// batch resent at the same position with valid gradients is applied, once. The requests are
// made as the wire carries them, straight to the server's handlers.
func TestFailedPositionedApplyIsAppliedOnResend(t *testing.T) {
	ctx := context.Background()
	opt := embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.1}
	cfg := embedding.Config{Dim: 2, Seed: 3, Optimizer: opt}
	s, err := NewServer(ServerConfig{ID: "a", Secret: []byte("an internal test secret of 32 B."), Slots: 16,
		Tables: []TableSpec{{Name: "emb", Config: cfg}, {Name: "mlp", Dense: 6, Config: embedding.Config{Optimizer: opt}}}})
	require.NoError(t, err)
	defer s.Close()
	owners, err := NewOwnerTable(1, 16, []Node{{ID: "a"}}, nil)
	require.NoError(t, err)
	_, err = s.SetOwnerTable(owners)
	require.NoError(t, err)
	pos := Position{Shard: 4, Start: 100, End: 110}
	nan := float32(math.NaN())
	refused := func(err error) {
		t.Helper()
		var re *rpc.RemoteError
		require.True(t, errors.As(err, &re), "%v", err)
		assert.Equal(t, codeNonFinite, re.Code)
	}

	t.Run("table", func(t *testing.T) {
		ids := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
		good := make([]float32, 2*len(ids))
		for i := range good {
			good[i] = float32(i%5) - 2
		}
		bad := append([]float32(nil), good...)
		bad[len(bad)-1] = nan
		push := func(g []float32) error {
			hdr := tableReq{version: 1, step: 1, dim: 2, table: "emb", pos: pos, flags: flagPosition}
			return s.handlePush(ctx, appendTableReq(nil, &hdr, ids, g, 0), new(rpc.Buffer))
		}
		tab, _ := s.Table("emb")
		refused(push(bad))
		assert.Zero(t, tab.Len(), "the failed push applied nothing")

		require.NoError(t, push(good))
		ref, err := embedding.New(cfg)
		require.NoError(t, err)
		require.NoError(t, ref.Apply(ids, good, 1))
		assert.Equal(t, rowsOfTable(ref), rowsOfTable(tab), "the resend at the failed position is applied")
		require.NoError(t, push(good))
		assert.Equal(t, rowsOfTable(ref), rowsOfTable(tab), "and then recorded: a second resend changes nothing")
	})

	t.Run("dense", func(t *testing.T) {
		good := []float32{0.5, -1, 2, 0.25, -0.75, 1}
		bad := []float32{0.5, -1, 2, 0.25, -0.75, nan}
		push := func(g []float32) error {
			hdr := tableReq{version: 1, step: 1, table: "mlp", pos: pos, flags: flagPosition}
			return s.handlePushDense(ctx, appendTableReq(nil, &hdr, nil, g, len(g)), new(rpc.Buffer))
		}
		tab, _ := s.Table("mlp")
		before := rowsOfTable(tab)
		refused(push(bad))
		assert.Equal(t, before, rowsOfTable(tab), "the failed push applied nothing")
		require.NoError(t, push(good))
		once := rowsOfTable(tab)
		assert.NotEqual(t, before, once, "the resend at the failed position is applied")
		require.NoError(t, push(good))
		assert.Equal(t, once, rowsOfTable(tab), "and then recorded: a second resend changes nothing")
	})
}
