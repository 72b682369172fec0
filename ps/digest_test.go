package ps_test

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
)

// trainDigested trains one model (an embedding table and a dense tensor) on a cluster of n
// servers and returns the cluster and the merged digests of its servers.
func trainDigested(t *testing.T, n int) (*pstest.Cluster, checkpoint.Digest) {
	dense := ps.TableSpec{Name: "w", Dense: 1500, Config: embedding.Config{Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.1}}}
	c := pstest.New(t, n, pstest.Options{Tables: []ps.TableSpec{spec("emb"), dense}})
	cl := c.Client("worker-0", ps.ClientConfig{})
	ctx := pstest.Context(t)
	rng := rand.New(rand.NewPCG(7, 8))
	init := make([]float32, 1500)
	for i := range init {
		init[i] = float32(rng.NormFloat64())
	}
	require.NoError(t, cl.InitDense(ctx, "w", init, embedding.Optimizer{}))
	for step := uint64(1); step <= 20; step++ {
		ids, g := randomBatch(rng, 40, 300)
		require.NoError(t, cl.Push(ctx, "emb", ids, g, step))
		dg := make([]float32, 1500)
		for i := range dg {
			dg[i] = float32(rng.NormFloat64())
		}
		require.NoError(t, cl.PushDense(ctx, "w", dg, step))
	}
	return c, digestOf(t, c)
}

func digestOf(t *testing.T, c *pstest.Cluster) checkpoint.Digest {
	var parts []checkpoint.Digest
	for _, s := range c.Servers {
		d, err := s.Digest(pstest.Context(t), nil)
		require.NoError(t, err)
		parts = append(parts, d)
	}
	d, err := checkpoint.Merge(parts...)
	require.NoError(t, err)
	return d
}

// The same model on 2 or 3 servers has one digest; one bit of one weight changes it.
func TestDigestIsTheModelsNotTheServers(t *testing.T) {
	two, d2 := trainDigested(t, 2)
	_, d3 := trainDigested(t, 3)
	require.Len(t, d2.Tables, 2)
	assert.Positive(t, d2.Tables[0].Rows)
	assert.EqualValues(t, 2, d2.Tables[1].Rows, "the dense tensor's rows of 1024 floats")
	require.NoError(t, d2.Compare(d3))

	// Flip the lowest bit of one weight of one row, where it lives.
	for _, s := range two.Servers {
		tab, _ := s.Table("emb")
		var id uint64
		var w []float32
		tab.Range(func(v embedding.RowView) bool {
			if s.OwnerTable().SlotsOf(s.ID()).Contains(v.ID) {
				id, w = v.ID, append([]float32(nil), v.Weights...)
				return false
			}
			return true
		})
		if w == nil {
			continue
		}
		w[1] = math.Float32frombits(math.Float32bits(w[1]) ^ 1)
		require.NoError(t, tab.Assign([]uint64{id}, w))
		break
	}
	flipped := digestOf(t, two)
	assert.Equal(t, []string{"table emb: " + itoa(d2.Tables[0].Rows) + " rows each, their values differ"}, d2.Diff(flipped))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// A server digests only the slots its table gives it: rows it holds of other slots (copies a
// migration left, say) are not its part of the model.
func TestDigestCountsOnlyOwnedSlots(t *testing.T) {
	c, d := trainDigested(t, 2)
	a := c.Servers[0]
	ta, _ := a.Table("emb")
	var foreign uint64
	for id := uint64(1); ; id++ {
		if !a.OwnerTable().SlotsOf(a.ID()).Contains(id) {
			foreign = id
			break
		}
	}
	require.NoError(t, ta.Assign([]uint64{foreign}, []float32{1, 2, 3, 4}))
	require.NoError(t, d.Compare(digestOf(t, c)))
	fresh, err := ps.NewServer(ps.ServerConfig{ID: "x", Secret: pstest.Secret()})
	require.NoError(t, err)
	defer fresh.Close()
	_, err = fresh.Digest(pstest.Context(t), nil)
	assert.ErrorIs(t, err, ps.ErrNoTable)
}
