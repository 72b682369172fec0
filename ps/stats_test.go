package ps_test

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tableStats returns the named table's counters of every server, summed.
func tableStats(servers []*ps.Server, name string) ps.TableStats {
	var sum ps.TableStats
	for _, s := range servers {
		for _, ts := range s.Stats(false).Tables {
			if ts.Name != name {
				continue
			}
			sum.Pulls += ts.Pulls
			sum.Pushes += ts.Pushes
			sum.RowsOut += ts.RowsOut
			sum.RowsIn += ts.RowsIn
			sum.BytesOut += ts.BytesOut
			sum.BytesIn += ts.BytesIn
		}
	}
	return sum
}

// TestStatsCountWhatWasServed checks each counter of a server's report against the requests a
// test made: rows and bytes per table, requests in the latency histograms, refusals by reason,
// and the process.
func TestStatsCountWhatWasServed(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	cl.SetEpoch(1<<32 | 1)
	ids := make([]uint64, 100)
	for i := range ids {
		ids[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	g := make([]float32, len(ids)*dim)
	for i := range g {
		g[i] = 0.25
	}
	for step := uint64(1); step <= 3; step++ {
		require.NoError(t, cl.Pull(ctx, "emb", ids, make([]float32, len(ids)*dim)))
		require.NoError(t, cl.Push(ctx, "emb", ids, g, step))
	}
	require.NoError(t, cl.InitDense(ctx, "mlp", make([]float32, 10), embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.1}))
	require.NoError(t, cl.PullDense(ctx, "mlp", make([]float32, 10)))
	require.NoError(t, cl.PullDense(ctx, "mlp", make([]float32, 10)))
	require.NoError(t, cl.PushDense(ctx, "mlp", make([]float32, 10), 1))

	emb := tableStats(c.Servers, "emb")
	assert.Equal(t, uint64(3*len(ids)), emb.RowsOut, "every id pulled was counted once")
	assert.Equal(t, uint64(3*len(ids)), emb.RowsIn)
	assert.Equal(t, emb.RowsOut*4*dim, emb.BytesOut)
	assert.Equal(t, emb.RowsIn*4*dim, emb.BytesIn)
	mlp := tableStats(c.Servers, "mlp")
	assert.Equal(t, uint64(2), mlp.Pulls)
	assert.Equal(t, uint64(1), mlp.Pushes)
	assert.Equal(t, uint64(2*10*4), mlp.BytesOut)

	var pulls, pushes, sparsePulls uint64
	for _, s := range c.Servers {
		st := s.Stats(false)
		sparsePulls += st.Pulls
		for _, h := range []ps.Histogram{st.PullLatency, st.PushLatency} {
			require.Len(t, h.Counts, len(h.Bounds)+1)
			var n uint64
			for _, k := range h.Counts {
				n += k
			}
			assert.Equal(t, h.Count, n, "the buckets hold every request")
			if h.Count > 0 {
				assert.Positive(t, h.Sum)
			}
		}
		pulls += st.PullLatency.Count
		pushes += st.PushLatency.Count
		assert.Equal(t, os.Getpid(), st.Process.Pid)
		assert.Positive(t, st.Process.CPU)
		assert.Zero(t, st.RefusedFenced+st.RefusedWrongOwner+st.RefusedMoved, "nothing refused yet")
	}
	assert.Equal(t, emb.Pulls+mlp.Pulls, pulls, "each pull request is timed once")
	assert.Equal(t, emb.Pushes+mlp.Pushes, pushes)
	assert.Equal(t, emb.Pulls, sparsePulls)

	// A fenced epoch's push is refused by each server it reaches.
	for _, s := range c.Servers {
		s.Fence(cl.Epoch())
	}
	require.ErrorIs(t, cl.Push(ctx, "emb", ids, g, 4), ps.ErrFenced)
	var fenced uint64
	for _, s := range c.Servers {
		fenced += s.Stats(false).RefusedFenced
	}
	assert.Equal(t, uint64(len(c.Servers)), fenced)

	// A client routing by a wrong table is refused by the server it wrongly asks.
	wrong, err := ps.NewOwnerTable(1, c.Slots, []ps.Node{c.Node("ps-1")}, nil)
	require.NoError(t, err)
	stale := &ps.TableHolder{}
	stale.Set(wrong)
	lost := c.Client("lost", ps.ClientConfig{Resolver: stale, Retries: 1})
	require.ErrorIs(t, lost.Pull(ctx, "emb", ids, make([]float32, len(ids)*dim)), ps.ErrWrongOwner)
	assert.Positive(t, c.Server("ps-1").Stats(false).RefusedWrongOwner)
	assert.Zero(t, c.Server("ps-0").Stats(false).RefusedWrongOwner, "ps-0 was not asked")
}

// A report travels in JSON: the process's cgroup figures go with it, and a report of a server
// that does not send them (an older one) decodes with none, so its resident memory is used.
func TestProcessStatsWire(t *testing.T) {
	in := ps.ServerStats{ID: "ps-0", Process: ps.ProcessStats{Pid: 7, Host: "h", ResidentBytes: 160 << 20, CgroupBytes: 90 << 20, CgroupLimitBytes: 112 << 20}}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	var out ps.ServerStats
	require.NoError(t, json.Unmarshal(b, &out))
	assert.Equal(t, in.Process, out.Process)

	var old ps.ServerStats
	require.NoError(t, json.Unmarshal([]byte(`{"ID":"ps-0","Process":{"Pid":7,"Host":"h","CPU":5,"ResidentBytes":167772160}}`), &old))
	assert.Equal(t, ps.ProcessStats{Pid: 7, Host: "h", CPU: 5, ResidentBytes: 160 << 20}, old.Process)
}
