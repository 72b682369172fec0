package ps

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scatterCluster is a few servers in memory for the tests of this file (pstest imports ps, so
// an internal test cannot use it).
type scatterCluster struct {
	net     *memnet.Network
	servers []*Server
	nodes   []Node
	holder  *TableHolder
	slots   int
}

var scatterSecret = []byte("the scatter test secret, 32 B...")

func scatterTableConfig() embedding.Config {
	return embedding.Config{Dim: 8, Seed: 9, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.1}}
}

func newScatterCluster(t *testing.T, n int) *scatterCluster {
	t.Helper()
	c := &scatterCluster{net: memnet.New(memnet.Config{}), holder: &TableHolder{}, slots: 64}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		for _, s := range c.servers {
			s.Close()
		}
		wg.Wait()
	})
	for i := range n {
		id := fmt.Sprintf("ps-%d", i)
		srv, err := NewServer(ServerConfig{ID: id, Secret: scatterSecret, Slots: c.slots, Transport: c.net.Host(id),
			Tables: []TableSpec{{Name: "emb", Config: scatterTableConfig()}}})
		require.NoError(t, err)
		l, err := c.net.Host(id).Listen(id + ":1")
		require.NoError(t, err)
		c.servers = append(c.servers, srv)
		c.nodes = append(c.nodes, Node{ID: id, Addr: l.Addr().String()})
		wg.Add(1)
		go func(l net.Listener) {
			defer wg.Done()
			srv.Serve(l)
		}(l)
	}
	tab, err := NewOwnerTable(1, c.slots, c.nodes, nil)
	require.NoError(t, err)
	c.publish(t, tab)
	return c
}

func (c *scatterCluster) publish(t *testing.T, tab *OwnerTable) {
	for _, s := range c.servers {
		_, err := s.SetOwnerTable(tab)
		require.NoError(t, err)
	}
	c.holder.Set(tab)
}

func (c *scatterCluster) client(t *testing.T, name string) *Client {
	cl, err := NewClient(ClientConfig{Secret: scatterSecret, Transport: c.net.Host(name), Resolver: c.holder})
	require.NoError(t, err)
	t.Cleanup(func() { cl.Close() })
	return cl
}

// zipfBatch returns n ids drawn Zipf(1.1) from vocab: many repeats, in no order.
func zipfBatch(rng *rand.Rand, n int, vocab uint64) []uint64 {
	z := rand.NewZipf(rng, 1.1, 1, vocab-1)
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = z.Uint64() * 0x9e3779b97f4a7c15
	}
	return ids
}

// Pulls of batches with many repeats over three servers equal a local table, also when one
// server's part is refused for a stale table and resent (the resent part's answer fills its
// positions), and while several pulls run at once.
func TestPullRepeatsMatchLocalTableAcrossStaleRetry(t *testing.T) {
	c := newScatterCluster(t, 3)
	cl := c.client(t, "w")
	ctx := context.Background()
	ref, err := embedding.New(scatterTableConfig())
	require.NoError(t, err)
	const n, vocab, dim = 2000, 3000, 8
	rng := rand.New(rand.NewPCG(7, 8))
	check := func(cl *Client, ids []uint64, what string) {
		got := make([]float32, len(ids)*dim)
		want := make([]float32, len(ids)*dim)
		require.NoError(t, cl.Pull(ctx, "emb", ids, got))
		require.NoError(t, ref.Lookup(ids, want))
		require.Equal(t, want, got, what)
	}
	for step := uint32(1); step <= 5; step++ {
		ids := zipfBatch(rng, n, vocab)
		check(cl, ids, fmt.Sprintf("step %d", step))
		g := make([]float32, len(ids)*dim)
		for i := range g {
			g[i] = float32(rng.NormFloat64())
		}
		require.NoError(t, cl.Push(ctx, "emb", ids, g, uint64(step)))
		require.NoError(t, ref.Apply(ids, g, step))
	}

	// Version 2 drops ps-2; its rows move to their new owners. The client still routes by
	// version 1: ps-0 and ps-1 answer, ps-2 refuses, and its part is resent by version 2.
	old := c.holder.Get()
	next, err := NewOwnerTable(2, c.slots, old.Nodes[:2], old)
	require.NoError(t, err)
	for _, m := range old.Moves(next) {
		from, _ := c.servers[2].Table("emb")
		require.Equal(t, "ps-2", m.From, "only ps-2's slots move")
		var to *embedding.Table
		for i, nd := range c.nodes {
			if nd.ID == m.To {
				to, _ = c.servers[i].Table("emb")
			}
		}
		buf := make([]byte, from.RawSize(false))
		k, err := from.CopyRawSlots(buf, embedding.NewSlotSet(c.slots, m.Slot).Contains)
		require.NoError(t, err)
		_, err = to.LoadRaw(buf[:k], nil)
		require.NoError(t, err)
	}
	c.publish(t, next)
	before := c.servers[2].Stats(false).Pulls
	ids := zipfBatch(rng, n, vocab)
	check(cl, ids, "after the change")
	tab, err := cl.OwnerTable(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), tab.Version, "the client was refused and refreshed its table")
	assert.Equal(t, before, c.servers[2].Stats(false).Pulls, "ps-2 served nothing")

	// Several clients, each first refused by ps-2, pull at once.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	c.holder.Set(old) // new clients start stale
	clients := make([]*Client, len(errs))
	for i := range clients {
		clients[i] = c.client(t, fmt.Sprintf("w-%d", i))
		_, err := clients[i].OwnerTable(ctx)
		require.NoError(t, err)
	}
	c.holder.Set(next)
	for i, cl := range clients {
		ids := zipfBatch(rand.New(rand.NewPCG(uint64(i), 1)), n, vocab)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				got := make([]float32, len(ids)*dim)
				want := make([]float32, len(ids)*dim)
				if errs[i] = cl.Pull(ctx, "emb", ids, got); errs[i] != nil {
					return
				}
				if errs[i] = ref.Lookup(ids, want); errs[i] != nil {
					return
				}
				if !assert.Equal(t, want, got, "client %d", i) {
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// A refused pull that cannot be resent fails with every response it held released, and the
// client keeps working.
func TestPullFailureKeepsClientWorking(t *testing.T) {
	c := newScatterCluster(t, 2)
	cl := c.client(t, "w")
	ctx := context.Background()
	ids := zipfBatch(rand.New(rand.NewPCG(1, 1)), 500, 400)
	got := make([]float32, len(ids)*8)
	require.ErrorIs(t, cl.Pull(ctx, "nope", ids, got), ErrUnknownTable)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, cl.Pull(cctx, "emb", ids, got), context.Canceled)
	ref, err := embedding.New(scatterTableConfig())
	require.NoError(t, err)
	want := make([]float32, len(ids)*8)
	require.NoError(t, cl.Pull(ctx, "emb", ids, got, ReadOnly()))
	require.NoError(t, ref.Lookup(ids, want))
	assert.Equal(t, want, got)
}

// oldScatter is the fold and scatter Pull used before it held its responses: a dedupe with
// separate key and value tables, then each part's rows copied, as the part's answer arrives, to
// every position of their id by walking first/next. Kept here only to compare with.
type oldScatter struct {
	uniq, hash        []uint64
	first, last, next []int32
	keys              []uint64
	vals              []int32
}

func (sc *oldScatter) dedupe(ids []uint64) {
	size := 16
	for size < 2*len(ids) {
		size <<= 1
	}
	if cap(sc.keys) < size {
		sc.keys = make([]uint64, size)
		sc.vals = make([]int32, size)
	}
	keys, vals := sc.keys[:size], sc.vals[:size]
	clear(vals)
	sc.uniq, sc.hash, sc.first, sc.last = sc.uniq[:0], sc.hash[:0], sc.first[:0], sc.last[:0]
	if cap(sc.next) < len(ids) {
		sc.next = make([]int32, len(ids))
	}
	sc.next = sc.next[:len(ids)]
	mask := uint64(size - 1)
	for i, id := range ids {
		sc.next[i] = -1
		h := idHash(id)
		for k := h & mask; ; k = (k + 1) & mask {
			if vals[k] == 0 {
				keys[k] = id
				sc.uniq = append(sc.uniq, id)
				sc.hash = append(sc.hash, h)
				sc.first = append(sc.first, int32(i))
				sc.last = append(sc.last, int32(i))
				vals[k] = int32(len(sc.uniq))
				break
			}
			if keys[k] == id {
				u := vals[k] - 1
				sc.next[sc.last[u]] = int32(i)
				sc.last[u] = int32(i)
				break
			}
		}
	}
}

// scatterBench is a pull's client-side work without the network: fold the batch, split it over
// the servers, fill each part's answer as a socket read would (from rows), and put the rows in
// dst.
type scatterBench struct {
	ids   []uint64
	dim   int
	t     *OwnerTable
	rows  []byte // every id's row, by uniq index, as the servers would send it
	resps [][]byte
	dst   []float32
}

func newScatterBench(tb testing.TB, batch, servers, dim int) *scatterBench {
	rng := rand.New(rand.NewPCG(3, 5))
	b := &scatterBench{ids: zipfBatch(rng, batch, 8<<20), dim: dim, dst: make([]float32, batch*dim)}
	var nodes []Node
	for i := range servers {
		nodes = append(nodes, Node{ID: fmt.Sprint(i), Addr: fmt.Sprint(i)})
	}
	var err error
	b.t, err = NewOwnerTable(1, 1024, nodes, nil)
	require.NoError(tb, err)
	row := make([]float32, batch*dim)
	for i := range row {
		row[i] = float32(rng.NormFloat64())
	}
	b.rows = make([]byte, 4*len(row))
	putFloats(b.rows, row)
	b.resps = make([][]byte, servers)
	for i := range b.resps {
		b.resps[i] = make([]byte, 4*dim*batch)
	}
	return b
}

// answer fills part o's response buffer with its rows, in the order of idx.
func (b *scatterBench) answer(o int, idx []int32) []byte {
	rb := 4 * b.dim
	resp := b.resps[o][:rb*len(idx)]
	for k, i := range idx {
		copy(resp[rb*k:rb*(k+1)], b.rows[rb*int(i):rb*int(i+1)])
	}
	return resp
}

func (b *scatterBench) runOld(sc *oldScatter, split *clientScratch) {
	sc.dedupe(b.ids)
	split.hash, split.uniq = sc.hash, sc.uniq
	parts := split.split(b.t, allIdx(split, len(sc.uniq)), false)
	dim, rb := b.dim, 4*b.dim
	for o, p := range parts {
		resp := b.answer(o, p.idx)
		for k, i := range p.idx {
			row := resp[rb*k : rb*(k+1)]
			for q := sc.first[i]; q >= 0; q = sc.next[q] {
				getFloats(b.dst[int(q)*dim:int(q+1)*dim], row)
			}
		}
	}
}

func (b *scatterBench) runNew(sc *clientScratch) {
	sc.dedupe(b.ids, false)
	if cap(sc.where) < len(sc.uniq) {
		sc.where = make([]uint64, len(sc.uniq))
	}
	sc.where = sc.where[:len(sc.uniq)]
	parts := sc.split(b.t, allIdx(sc, len(sc.uniq)), false)
	for o, p := range parts {
		sc.hold(b.answer(o, p.idx), p.idx, 4*b.dim)
	}
	sc.gather(b.dst, b.dim)
	clear(sc.resps) // the benchmark owns the buffers
	sc.resps = sc.resps[:0]
}

func allIdx(sc *clientScratch, n int) []int32 {
	if cap(sc.idx) < n {
		sc.idx = make([]int32, n)
	}
	idx := sc.idx[:n]
	for i := range idx {
		idx[i] = int32(i)
	}
	return idx
}

// The new and old ways give the same dst.
func TestScatterBenchAgrees(t *testing.T) {
	b := newScatterBench(t, 4096, 2, 64)
	b.runOld(&oldScatter{}, &clientScratch{})
	want := append([]float32(nil), b.dst...)
	clear(b.dst)
	b.runNew(&clientScratch{})
	require.True(t, slices.Equal(want, b.dst), "the new way differs")
}

// BenchmarkPullScatter compares a pull's client-side fold and scatter (4096 Zipf ids over 8 M,
// dim 64, two servers), the old way (rows copied to every position as each answer arrives)
// and the new (answers held, dst filled in caller order). Run the two alternately to compare.
func BenchmarkPullScatter(b *testing.B) {
	sb := newScatterBench(b, 4096, 2, 64)
	b.Run("old", func(b *testing.B) {
		sc, split := &oldScatter{}, &clientScratch{}
		b.SetBytes(int64(4 * len(sb.dst)))
		b.ReportAllocs()
		for b.Loop() {
			sb.runOld(sc, split)
		}
		b.ReportMetric(float64(len(sc.uniq)), "distinct")
	})
	b.Run("new", func(b *testing.B) {
		sc := &clientScratch{}
		b.SetBytes(int64(4 * len(sb.dst)))
		b.ReportAllocs()
		for b.Loop() {
			sb.runNew(sc)
		}
		b.ReportMetric(float64(len(sc.uniq)), "distinct")
	})
}
