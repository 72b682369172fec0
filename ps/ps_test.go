package ps_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/ps/pstest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const dim = 4

func spec(name string) ps.TableSpec {
	return ps.TableSpec{Name: name, Config: embedding.Config{Dim: dim, Seed: 5, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad, LearningRate: 0.1}}}
}

// reference is the same table held locally: the cluster must match it row for row.
func reference(t *testing.T) *embedding.Table {
	tab, err := embedding.New(spec("x").Config)
	require.NoError(t, err)
	return tab
}

func randomBatch(rng *rand.Rand, n, vocab int) ([]uint64, []float32) {
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = uint64(rng.IntN(vocab)) * 0x9e3779b97f4a7c15
	}
	g := make([]float32, n*dim)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	return ids, g
}

func TestPullPushMatchesLocalTable(t *testing.T) {
	c := pstest.New(t, 3, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	cl := c.Client("worker-0", ps.ClientConfig{})
	ref := reference(t)
	ctx := pstest.Context(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for step := uint32(1); step <= 30; step++ {
		ids, g := randomBatch(rng, 50, 200)
		got := make([]float32, len(ids)*dim)
		want := make([]float32, len(ids)*dim)
		require.NoError(t, cl.Pull(ctx, "emb", ids, got))
		require.NoError(t, ref.Lookup(ids, want))
		require.Equal(t, want, got, "step %d", step)
		require.NoError(t, cl.Push(ctx, "emb", ids, g, uint64(step)))
		require.NoError(t, ref.Apply(ids, g, step))
	}
	// The rows are spread over all three servers, each holding only slots it owns.
	total := 0
	for _, s := range c.Servers {
		tab, ok := s.Table("emb")
		require.True(t, ok)
		owned := s.OwnerTable().SlotsOf(s.ID())
		tab.Range(func(v embedding.RowView) bool {
			assert.True(t, owned.Contains(v.ID), "server %s holds a row of a slot it does not own", s.ID())
			return true
		})
		assert.Positive(t, tab.Len())
		total += tab.Len()
	}
	assert.Equal(t, ref.Len(), total)
}

func TestBadRequestsGetClearErrors(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	cl := c.Client("w", ps.ClientConfig{})
	ctx := pstest.Context(t)
	err := cl.Pull(ctx, "nope", []uint64{1}, make([]float32, dim))
	require.ErrorIs(t, err, ps.ErrUnknownTable)
	var se *ps.ServerError
	require.ErrorAs(t, err, &se)
	assert.Contains(t, c.Addrs, se.Server)
	require.ErrorIs(t, cl.Pull(ctx, "emb", []uint64{1}, make([]float32, dim+1)), ps.ErrBadRequest)
	require.ErrorIs(t, cl.Pull(ctx, "emb", []uint64{1, 2}, make([]float32, 3*dim)), ps.ErrBadRequest)
	// A NaN fails the whole push before anything is sent: no server changes.
	ids := []uint64{1, 2, 3, 4, 5, 6}
	g := make([]float32, len(ids)*dim)
	g[len(g)-1] = float32(nanValue())
	require.ErrorIs(t, cl.Push(ctx, "emb", ids, g, 1), ps.ErrNonFinite)
	for _, s := range c.Servers {
		tab, _ := s.Table("emb")
		assert.Equal(t, 0, tab.Len())
	}
}

func nanValue() float64 { var z float64; return z / z }

// TestStaleClientIsNeverWrong moves slots to a new server while a client still routes by the old
// table: the servers refuse what they no longer own, the client refreshes and retries, and every
// result equals the local reference.
func TestStaleClientIsNeverWrong(t *testing.T) {
	c := pstest.New(t, 3, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	stale := c.Client("w-stale", ps.ClientConfig{Servers: c.Addrs}) // resolves by asking servers
	ref := reference(t)
	rng := rand.New(rand.NewPCG(3, 4))
	ids, g := randomBatch(rng, 64, 100)
	require.NoError(t, stale.Push(ctx, "emb", ids, g, 1))
	require.NoError(t, ref.Apply(ids, g, 1))

	// Version 2 drops ps-2: its rows move (by export/import) to their new owners.
	old := c.Holder.Get()
	next, err := ps.NewOwnerTable(2, c.Slots, old.Nodes[:2], old)
	require.NoError(t, err)
	moveSlots(t, c, old, next)
	c.Publish(next)

	got := make([]float32, len(ids)*dim)
	want := make([]float32, len(ids)*dim)
	require.NoError(t, stale.Pull(ctx, "emb", ids, got))
	require.NoError(t, ref.Lookup(ids, want))
	assert.Equal(t, want, got)
	tab, _ := stale.OwnerTable(ctx)
	assert.Equal(t, uint64(2), tab.Version, "the client refreshed its table")
	before := c.Servers[2].Stats(false)
	require.NoError(t, stale.Push(ctx, "emb", ids, g, 2))
	require.NoError(t, stale.Pull(ctx, "emb", ids, got))
	after := c.Servers[2].Stats(false)
	assert.Equal(t, before.Pushes, after.Pushes, "the old owner applied nothing after the change")
	assert.Equal(t, before.Pulls, after.Pulls, "and served nothing")
}

// moveSlots copies the rows of every slot that changes owner from its old server to its new one.
func moveSlots(t *testing.T, c *pstest.Cluster, from, to *ps.OwnerTable) {
	byID := map[string]*ps.Server{}
	for _, s := range c.Servers {
		byID[s.ID()] = s
	}
	for _, m := range from.Moves(to) {
		src, _ := byID[m.From].Table("emb")
		dst, _ := byID[m.To].Table("emb")
		set := embedding.NewSlotSet(c.Slots, m.Slot)
		buf := make([]byte, src.RawSize(false))
		n, err := src.CopyRawSlots(buf, set.Contains)
		require.NoError(t, err)
		_, err = dst.LoadRaw(buf[:n], nil)
		require.NoError(t, err)
	}
}

func TestServerKilledMidRequest(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	cl := c.Client("w", ps.ClientConfig{Retries: 2, RetryBackoff: time.Millisecond})
	ctx := pstest.Context(t)
	ids := make([]uint64, 200)
	for i := range ids {
		ids[i] = uint64(i)
	}
	rows := make([]float32, len(ids)*dim)
	require.NoError(t, cl.Pull(ctx, "emb", ids, rows))
	// Hold ps-1's answers, then kill it while the pull waits: the pull fails promptly, naming it.
	c.Net.Partition("w", "ps-1")
	done := make(chan error, 1)
	go func() { done <- cl.Pull(ctx, "emb", ids, rows) }()
	c.Net.Kill("ps-1")
	select {
	case err := <-done:
		require.Error(t, err)
		var se *ps.ServerError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, c.Addrs[1], se.Server)
	case <-time.After(20 * time.Second):
		t.Fatal("pull hung after its server died")
	}
	// A push to a dead server is an error, never success; ps-0 applied its part and the error
	// says so.
	err := cl.Push(ctx, "emb", ids, make([]float32, len(ids)*dim), 2)
	require.ErrorIs(t, err, ps.ErrPartialPush)
	require.ErrorAs(t, err, new(*ps.ServerError))
}

func TestWrongSecretRefused(t *testing.T) {
	c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	cl, err := ps.NewClient(ps.ClientConfig{Secret: []byte("not the cluster secret (32 B.).."), Transport: c.Net.Host("intruder"), Resolver: c.Holder, Retries: 1})
	require.NoError(t, err)
	defer cl.Close()
	err = cl.Pull(pstest.Context(t), "emb", []uint64{1}, make([]float32, dim))
	require.ErrorIs(t, err, rpc.ErrAuth)
	st := c.Servers[0].Stats(false)
	assert.Zero(t, st.Pulls, "the server read no request")
}

func TestShortSecretRefused(t *testing.T) {
	short := []byte("a secret under 32 bytes")
	err := ps.ServerConfig{ID: "ps-0", Secret: short}.Validate()
	require.ErrorIs(t, err, ps.ErrBadConfig)
	assert.Contains(t, err.Error(), "Secret is 23 bytes; at least 32")
	_, err = ps.NewServer(ps.ServerConfig{ID: "ps-0", Secret: short})
	require.ErrorIs(t, err, ps.ErrBadConfig)
	err = ps.ClientConfig{Secret: short, Servers: []string{"ps-0:1"}}.Validate()
	require.ErrorIs(t, err, ps.ErrBadConfig)
	assert.Contains(t, err.Error(), "Secret")
	require.ErrorIs(t, ps.ClientConfig{Secret: pstest.Secret(), Servers: []string{"ps-0:1"}, Protection: 9}.Validate(), ps.ErrBadConfig)
	require.NoError(t, ps.ClientConfig{Secret: pstest.Secret(), Servers: []string{"ps-0:1"}, Protection: ps.ProtectEncrypt}.Validate())
}

// Servers that ask for encryption get it from clients that do not; pulls
// and pushes work the same.
func TestEncryptedCluster(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, Protection: ps.ProtectEncrypt})
	ctx := pstest.Context(t)
	cl := c.Client("worker-0", ps.ClientConfig{})
	ids := []uint64{1, 2, 3, 1 << 40}
	before := make([]float32, len(ids)*dim)
	require.NoError(t, cl.Pull(ctx, "emb", ids, before))
	grads := make([]float32, len(ids)*dim)
	for i := range grads {
		grads[i] = 1
	}
	require.NoError(t, cl.Push(ctx, "emb", ids, grads, 1))
	after := make([]float32, len(ids)*dim)
	require.NoError(t, cl.Pull(ctx, "emb", ids, after))
	assert.NotEqual(t, before, after)
}

func TestConcurrentClients(t *testing.T) {
	c := pstest.New(t, 3, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	// SGD with a constant gradient is order-independent: the final rows are exact.
	var wg sync.WaitGroup
	const workers, steps = 4, 25
	for w := 0; w < workers; w++ {
		cl := c.Client("w"+string(rune('a'+w)), ps.ClientConfig{})
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for s := 0; s < steps; s++ {
				ids, _ := randomBatch(rng, 40, 300)
				rows := make([]float32, len(ids)*dim)
				if !assert.NoError(t, cl.Pull(ctx, "emb", ids, rows)) {
					return
				}
				if !assert.NoError(t, cl.Push(ctx, "emb", ids, make([]float32, len(ids)*dim), uint64(s))) {
					return
				}
			}
		}(w)
	}
	wg.Wait()
	var rows, pushes uint64
	for _, s := range c.Servers {
		st := s.Stats(true)
		pushes += st.Pushes
		for _, sl := range st.Slots {
			if sl.Rows > 0 {
				assert.True(t, sl.Owned)
			}
			rows += uint64(sl.Rows)
		}
	}
	assert.Positive(t, pushes)
	assert.Positive(t, rows)
}

// TestSyncModeIsDeterministic runs two workers against synchronous servers twice with different
// timing; the tables come out identical, and equal to applying worker 0 then worker 1 each step.
func TestSyncModeIsDeterministic(t *testing.T) {
	run := func(delay time.Duration) map[uint64][]float32 {
		c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, SyncWorkers: 2})
		ctx := pstest.Context(t)
		var wg sync.WaitGroup
		for w := 0; w < 2; w++ {
			cl := c.Client("w"+string(rune('0'+w)), ps.ClientConfig{Sync: true, Worker: w})
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				for s := uint32(1); s <= 10; s++ {
					ids, g := randomBatch(rng, 20, 60)
					if w == 1 && delay > 0 {
						time.Sleep(delay) // worker 1 is slow: ordering on the wire changes, results must not
					}
					rows := make([]float32, len(ids)*dim)
					if !assert.NoError(t, cl.Pull(ctx, "emb", ids, rows)) {
						return
					}
					if !assert.NoError(t, cl.Push(ctx, "emb", ids, g, uint64(s))) {
						return
					}
				}
			}(w)
		}
		wg.Wait()
		out := map[uint64][]float32{}
		for _, s := range c.Servers {
			tab, _ := s.Table("emb")
			tab.Range(func(v embedding.RowView) bool {
				out[v.ID] = append([]float32(nil), v.Weights...)
				return true
			})
		}
		return out
	}
	a := run(0)
	b := run(2 * time.Millisecond)
	require.Equal(t, a, b)

	ref := reference(t)
	rngs := []*rand.Rand{rand.New(rand.NewPCG(0, 7)), rand.New(rand.NewPCG(1, 7))}
	for s := uint32(1); s <= 10; s++ {
		for w := 0; w < 2; w++ {
			ids, g := randomBatch(rngs[w], 20, 60)
			require.NoError(t, ref.Apply(ids, g, s))
		}
	}
	ref.Range(func(v embedding.RowView) bool {
		assert.Equal(t, v.Weights, a[v.ID])
		return true
	})
}

func TestDenseTensors(t *testing.T) {
	c := pstest.New(t, 3, pstest.Options{})
	ctx := pstest.Context(t)
	a := c.Client("wa", ps.ClientConfig{})
	b := c.Client("wb", ps.ClientConfig{})
	init := make([]float32, 2500) // more than one dense row
	for i := range init {
		init[i] = float32(i)
	}
	opt := embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.5}
	require.NoError(t, a.InitDense(ctx, "mlp", init, opt))
	require.NoError(t, b.InitDense(ctx, "mlp", make([]float32, 2500), opt), "a second init keeps the first values")
	got := make([]float32, 2500)
	require.NoError(t, b.PullDense(ctx, "mlp", got))
	assert.Equal(t, init, got)
	g := make([]float32, 2500)
	g[2499] = 2
	require.NoError(t, a.PushDense(ctx, "mlp", g, 1))
	require.NoError(t, b.PullDense(ctx, "mlp", got))
	assert.Equal(t, float32(2498), got[2499])
	require.ErrorIs(t, b.PullDense(ctx, "mlp", make([]float32, 10)), ps.ErrBadRequest)
	owners := 0
	for _, s := range c.Servers {
		if n, ok := s.DenseLength("mlp"); ok {
			owners++
			assert.Equal(t, 2500, n)
		}
	}
	assert.Equal(t, 1, owners, "a dense tensor lives on one server")
}

// A declared dense tensor takes its values from the first InitDense and keeps its declared
// optimizer, whatever optimizer InitDense passes; a later InitDense changes nothing.
func TestDeclaredDenseTensorKeepsItsOptimizer(t *testing.T) {
	declared := ps.TableSpec{Name: "w", Dense: 4, Config: embedding.Config{Optimizer: embedding.Optimizer{Kind: embedding.SGD, LearningRate: 1}}}
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{declared}})
	ctx := pstest.Context(t)
	cl := c.Client("w", ps.ClientConfig{})
	other := embedding.Optimizer{Kind: embedding.SGD, LearningRate: 0.25}
	require.NoError(t, cl.InitDense(ctx, "w", []float32{1, 2, 3, 4}, other))
	require.NoError(t, cl.InitDense(ctx, "w", []float32{9, 9, 9, 9}, other))
	got := make([]float32, 4)
	require.NoError(t, cl.PullDense(ctx, "w", got))
	assert.Equal(t, []float32{1, 2, 3, 4}, got, "the first InitDense's values")
	require.NoError(t, cl.PushDense(ctx, "w", []float32{1, 1, 1, 1}, 1))
	require.NoError(t, cl.PullDense(ctx, "w", got))
	assert.Equal(t, []float32{0, 1, 2, 3}, got, "the declared learning rate (1), not InitDense's (0.25)")
	require.ErrorIs(t, cl.InitDense(ctx, "w", make([]float32, 5), other), ps.ErrBadRequest, "another size")
}

func TestContextCancel(t *testing.T) {
	c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	cl := c.Client("w", ps.ClientConfig{})
	require.NoError(t, cl.Pull(pstest.Context(t), "emb", []uint64{1}, make([]float32, dim)))
	c.Net.Partition("w", "ps-0") // answers are held: the call can only end by its context
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err := cl.Pull(ctx, "emb", []uint64{1}, make([]float32, dim))
	require.True(t, errors.Is(err, context.DeadlineExceeded), "got %v", err)
}

// TestGarbageConnectionDoesNotHurtOthers writes junk on a raw connection to a server; the server
// drops that connection and keeps serving a real client.
func TestGarbageConnectionDoesNotHurtOthers(t *testing.T) {
	c := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	cl := c.Client("w", ps.ClientConfig{})
	ctx := pstest.Context(t)
	require.NoError(t, cl.Pull(ctx, "emb", []uint64{1}, make([]float32, dim)))
	for _, junk := range [][]byte{
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		make([]byte, 1<<16),
	} {
		conn, err := c.Net.Host("junk").Dial(ctx, c.Addrs[0])
		require.NoError(t, err)
		conn.Write(junk)
		buf := make([]byte, 1<<10)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		for { // the server closes the connection
			if _, err := conn.Read(buf); err != nil {
				break
			}
		}
		conn.Close()
		require.NoError(t, cl.Pull(ctx, "emb", []uint64{2}, make([]float32, dim)))
	}
}

func TestStatsFindHotSlots(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	cl := c.Client("w", ps.ClientConfig{})
	ctx := pstest.Context(t)
	hot := uint64(12345)
	slot := embedding.Slot(hot, c.Holder.Get().Slots)
	owner := c.Holder.Get().OwnerIndex(slot)
	before := c.Servers[owner].Stats(false)
	for i := 0; i < 50; i++ {
		require.NoError(t, cl.Pull(ctx, "emb", []uint64{hot, hot + uint64(i)*977}, make([]float32, 2*dim)))
	}
	after := c.Servers[owner].Stats(true)
	rates := after.Since(before)
	require.NotEmpty(t, rates)
	top := rates[0]
	for _, r := range rates {
		if r.AccessesPerSec > top.AccessesPerSec {
			top = r
		}
	}
	assert.Equal(t, slot, top.Slot, "the hot id's slot is the most accessed")
	assert.Positive(t, top.Busy)
	var rows int
	for _, s := range after.Slots {
		if s.Slot == slot {
			rows = s.Rows
		}
	}
	assert.GreaterOrEqual(t, rows, 1)
}

func TestSyncEdgeCases(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, SyncWorkers: 1})
	ctx := pstest.Context(t)
	cl := c.Client("w0", ps.ClientConfig{Sync: true, Worker: 0})
	// A worker with nothing to push for a step still takes part in every server's barrier.
	require.NoError(t, cl.Push(ctx, "emb", nil, nil, 1))
	require.NoError(t, cl.Push(ctx, "emb", []uint64{1, 2, 3}, make([]float32, 3*dim), 2))
	var pushes uint64
	for _, s := range c.Servers {
		pushes += s.Stats(false).Pushes
	}
	assert.Equal(t, uint64(4), pushes, "synchronous pushes are counted, empty ones too")
	// A synchronous server keeps its table.
	cur := c.Holder.Get()
	next, err := ps.NewOwnerTable(cur.Version+1, c.Slots, cur.Nodes[:1], cur)
	require.NoError(t, err)
	_, err = c.Servers[0].SetOwnerTable(next)
	require.ErrorIs(t, err, ps.ErrBadConfig)
	// Close does not hang on a step still waiting for a worker.
	c2 := pstest.New(t, 1, pstest.Options{Tables: []ps.TableSpec{spec("emb")}, SyncWorkers: 2})
	w := c2.Client("w", ps.ClientConfig{Sync: true, Worker: 0, Retries: 1})
	done := make(chan error, 1)
	go func() { done <- w.Push(ctx, "emb", []uint64{1}, make([]float32, dim), 1) }()
	c2.Close()
	require.Error(t, <-done)
}

func TestSetOwnerTableChecks(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{})
	s := c.Servers[0]
	_, err := s.SetOwnerTable(nil)
	require.ErrorIs(t, err, ps.ErrBadConfig)
	cur := c.Holder.Get()
	ok, err := s.SetOwnerTable(cur)
	require.NoError(t, err)
	assert.True(t, ok, "the same table again is fine")
	other, _ := ps.NewOwnerTable(cur.Version, c.Slots, cur.Nodes[:1], nil)
	_, err = s.SetOwnerTable(other)
	require.ErrorIs(t, err, ps.ErrBadConfig, "another table under the same version")
	older, _ := ps.NewOwnerTable(cur.Version-1, c.Slots, cur.Nodes, nil)
	ok, err = s.SetOwnerTable(older)
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Equal(t, cur.Version, s.OwnerTable().Version)
}

// TestClientAheadOfServerWaits: a client that already has version 2 meets a server still on 1;
// it backs off and resends until the server catches up, instead of failing at once.
func TestClientAheadOfServerWaits(t *testing.T) {
	c := pstest.New(t, 3, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	v1 := c.Holder.Get()
	v2, err := ps.NewOwnerTable(2, c.Slots, v1.Nodes[:2], v1)
	require.NoError(t, err)
	var id uint64
	for id = 1; v1.Owner(embedding.Slot(id, v1.Slots)).ID == v2.Owner(embedding.Slot(id, v2.Slots)).ID; id++ {
	}
	c.Holder.Set(v2) // the client learns of v2 before the servers do
	cl := c.Client("w", ps.ClientConfig{RetryBackoff: 5 * time.Millisecond, Retries: 10})
	publish := time.AfterFunc(30*time.Millisecond, func() { c.Publish(v2) })
	defer publish.Stop()
	require.NoError(t, cl.Push(pstest.Context(t), "emb", []uint64{id}, make([]float32, dim), 1))
}

func TestReadOnlyPull(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	cl := c.Client("w", ps.ClientConfig{})
	ctx := pstest.Context(t)
	ref := reference(t)
	ids := []uint64{1, 2, 3, 4}
	got := make([]float32, len(ids)*dim)
	want := make([]float32, len(ids)*dim)
	require.NoError(t, cl.Pull(ctx, "emb", ids, got, ps.ReadOnly()))
	require.NoError(t, ref.Lookup(ids, want))
	assert.Equal(t, want, got, "unknown ids read their initial value")
	for _, s := range c.Servers {
		tab, _ := s.Table("emb")
		assert.Equal(t, 0, tab.Len(), "and no row was made")
	}
}

// reportingResolver is a resolver that records the servers its clients could not reach.
type reportingResolver struct {
	*ps.TableHolder
	mu      sync.Mutex
	servers []string
}

func (r *reportingResolver) Unreachable(_ context.Context, server string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.servers = append(r.servers, server)
}

// A client tells a resolver that wants to know (ps.UnreachableReporter) of a server it cannot
// reach, before it waits for a newer table; a refusal by a live server is no such news.
func TestClientReportsAnUnreachableServer(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	r := &reportingResolver{TableHolder: c.Holder}
	cl := c.Client("w", ps.ClientConfig{Resolver: r, RetryBackoff: time.Millisecond, Retries: 3})
	ctx := pstest.Context(t)
	ids := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	require.NoError(t, cl.Push(ctx, "emb", ids, make([]float32, len(ids)*dim), 1))
	r.mu.Lock()
	assert.Empty(t, r.servers)
	r.mu.Unlock()

	dead := c.Holder.Get().Nodes[1]
	require.NoError(t, c.Servers[1].Close())
	err := cl.Push(ctx, "emb", ids, make([]float32, len(ids)*dim), 2)
	require.Error(t, err)
	r.mu.Lock()
	defer r.mu.Unlock()
	require.NotEmpty(t, r.servers)
	for _, s := range r.servers {
		assert.Equal(t, dead.Addr, s)
	}
}

// TestStatsCountEveryRequest checks the per-slot counters exactly while several clients pull
// and push at once: every row and every request is counted on the slot and server it touched.
func TestStatsCountEveryRequest(t *testing.T) {
	c := pstest.New(t, 2, pstest.Options{Tables: []ps.TableSpec{spec("emb")}})
	ctx := pstest.Context(t)
	table := c.Holder.Get()
	const workers, steps = 4, 40
	type slotCount struct{ accesses, requests uint64 }
	want := make([]map[int]*slotCount, len(c.Servers))
	wantPulls, wantPushes := make([]uint64, len(c.Servers)), make([]uint64, len(c.Servers))
	for i := range want {
		want[i] = map[int]*slotCount{}
	}
	batches := make([][][]uint64, workers)
	rng := rand.New(rand.NewPCG(3, 4))
	for w := range batches {
		for s := 0; s < steps; s++ {
			ids, _ := randomBatch(rng, 64, 500)
			batches[w] = append(batches[w], ids)
			// The client folds repeated ids; each server gets one request for its distinct ids.
			seen := map[uint64]bool{}
			touched := make([]map[int]bool, len(c.Servers))
			for _, id := range ids {
				if seen[id] {
					continue
				}
				seen[id] = true
				sl := embedding.Slot(id, table.Slots)
				o := table.OwnerIndex(sl)
				if want[o][sl] == nil {
					want[o][sl] = &slotCount{}
				}
				want[o][sl].accesses += 2 // pulled, then pushed
				if touched[o] == nil {
					touched[o] = map[int]bool{}
				}
				touched[o][sl] = true
			}
			for o, m := range touched {
				for sl := range m {
					want[o][sl].requests += 2
				}
				if len(m) > 0 {
					wantPulls[o]++
					wantPushes[o]++
				}
			}
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		cl := c.Client("w", ps.ClientConfig{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s, ids := range batches[w] {
				assert.NoError(t, cl.Pull(ctx, "emb", ids, make([]float32, len(ids)*dim)))
				g := make([]float32, len(ids)*dim)
				assert.NoError(t, cl.Push(ctx, "emb", ids, g, uint64(s+1)))
			}
		}()
	}
	wg.Wait()
	for o, srv := range c.Servers {
		st := srv.Stats(false)
		assert.Equal(t, wantPulls[o], st.Pulls, "server %d pulls", o)
		assert.Equal(t, wantPushes[o], st.Pushes, "server %d pushes", o)
		got := map[int]slotCount{}
		var busy uint64
		for _, s := range st.Slots {
			if s.Accesses > 0 || s.Requests > 0 {
				got[s.Slot] = slotCount{s.Accesses, s.Requests}
			}
			busy += s.BusyNanos
		}
		assert.Positive(t, busy, "server %d busy", o)
		require.Len(t, got, len(want[o]), "server %d: slots with activity", o)
		for sl, w := range want[o] {
			assert.Equal(t, *w, got[sl], "server %d slot %d", o, sl)
		}
	}
}

// A dense tensor's initial value must fit it; a server whose tables are fixed refuses to
// create one on the fly, naming where to declare it.
func TestDenseInitialValueAndFixedTables(t *testing.T) {
	bad := []ps.TableSpec{
		{Name: "a", Initial: []float32{1}},
		{Name: "b", Dense: 2, Initial: []float32{1}},
		{Name: "c", Dense: 1, Initial: []float32{float32(nanValue())}},
	}
	for _, spec := range bad {
		cfg := ps.ServerConfig{ID: "x", Secret: pstest.Secret(), Tables: []ps.TableSpec{spec}}
		assert.ErrorIs(t, cfg.Validate(), ps.ErrBadConfig, spec.Name)
	}
	srv, err := ps.NewServer(ps.ServerConfig{ID: "x", Secret: pstest.Secret(), DeclaredIn: "my.Config.Tables"})
	require.NoError(t, err)
	defer srv.Close()
	assert.ErrorIs(t, srv.CreateTable(bad[1]), ps.ErrBadConfig)

	c := pstest.New(t, 2, pstest.Options{})
	for _, s := range c.Servers {
		require.NoError(t, s.CreateTable(ps.TableSpec{Name: "w", Dense: 3, Initial: []float32{1, 2, 3}}))
	}
	cl := c.Client("w", ps.ClientConfig{})
	got := make([]float32, 3)
	require.NoError(t, cl.PullDense(pstest.Context(t), "w", got))
	assert.Equal(t, []float32{1, 2, 3}, got)
}
