package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
)

// psConns is the number of connections each of our clients keeps to each server
// (ps.ClientConfig.ConnsPerAddr); the Redis and gRPC peers get as many per goroutine and server.
const psConns = 2

// runPS measures pulls and pushes through the TCP client against in-process servers, and against
// baselines doing the same work: the same lookups straight on an embedding.Table (repeated ids
// folded as the client folds them), Redis (one instance per server, the same distinct rows,
// pipelined MGET) and a gRPC service over the same tables. Pulls run with each frame protection:
// integrity (the default), encryption, and none, which the servers here accept for this
// measurement only (a connection is unprotected only if both ends ask), so the cost of protection
// is a ratio measured in the same run. The peers run as their users run them by default, Redis
// and gRPC in plaintext, so each comparison is reported twice from the same rounds: our default
// against the peer, and our unprotected wire against it (like with like); gRPC over TLS is
// compared with our encrypted wire. Every comparison runs its subjects and baseline interleaved
// in rounds. Without -quick, pull rates are then swept over batch sizes and server counts.
// TestPSPullCPU (ps_profile_test.go) profiles the same pulls and breaks their CPU down by cause.
func runPS(ctx context.Context, opt options, r *report) error {
	const dim, batch, servers, goroutines = 64, 4096, 2, 2
	perServer := 4 << 20
	rounds, batchesPerRound := 7, 120
	if opt.quick {
		perServer, rounds, batchesPerRound = 1<<17, 3, 12
	}
	// Redis is a baseline of this suite: without it the suite fails rather than report less.
	redisBin, err := redisServerPath()
	if err != nil {
		return err
	}
	rows := perServer * servers
	tcfg := embedding.Config{Dim: dim, Seed: 1, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}
	cl, err := startCluster(servers, tcfg)
	if err != nil {
		return err
	}
	defer cl.close()

	fmt.Printf("ps: filling %d rows on %d servers and a local table of the same rows...\n", rows, servers)
	local, err := embedding.New(tcfg)
	if err != nil {
		return err
	}
	if err := cl.fill(rows, local); err != nil {
		return err
	}
	zipf := rankIDs(zipfStream(rows, batch*batchesPerRound, 7))
	distinct := rankIDs(distinctZipfStream(rows, batch, batchesPerRound, 8))

	clients, err := cl.clients(goroutines, ps.ProtectIntegrity)
	if err != nil {
		return err
	}
	defer closeClients(clients)
	encClients, err := cl.clients(goroutines, ps.ProtectEncrypt)
	if err != nil {
		return err
	}
	defer closeClients(encClients)
	plainClients, err := cl.clients(goroutines, ps.ProtectNone)
	if err != nil {
		return err
	}
	defer closeClients(plainClients)

	red, err := startRedis(ctx, opt, redisBin, cl, goroutines, local, dim, zipf, distinct)
	if err != nil {
		return fmt.Errorf("redis baseline: %w", err)
	}
	defer red.stop()
	gp, err := startGRPC(cl, goroutines, dim, false)
	if err != nil {
		return fmt.Errorf("grpc baseline: %w", err)
	}
	defer gp.stop()
	gt, err := startGRPC(cl, goroutines, dim, true)
	if err != nil {
		return fmt.Errorf("grpc baseline over TLS: %w", err)
	}
	defer gt.stop()

	grads := make([]float32, batch*dim)
	for i := range grads {
		grads[i] = 1e-4
	}
	folders := make([]*folder, goroutines)
	for g := range folders {
		folders[g] = newFolder(batch, dim)
	}
	pull := func(cs []*ps.Client) func(g int, b []uint64, out []float32) error {
		return func(g int, b []uint64, out []float32) error { return cs[g].Pull(ctx, "emb", b, out) }
	}
	localPull := func(g int, b []uint64, out []float32) error { return folders[g].lookup(local, b, out) }
	step := uint64(0)
	push := func(cs []*ps.Client) func(g int, b []uint64, out []float32) error {
		return func(g int, b []uint64, out []float32) error { return cs[g].Push(ctx, "emb", b, grads, step) }
	}
	grpcPull := func(g int, b []uint64, out []float32) error { return gp.clients[g].pull(ctx, b, out) }
	grpcTLSPull := func(g int, b []uint64, out []float32) error { return gt.clients[g].pull(ctx, b, out) }
	grpcPush := func(g int, b []uint64, out []float32) error { return gp.clients[g].push(ctx, b, grads, step) }
	on := func(name string, ids []uint64, fn func(g int, b []uint64, out []float32) error) trial {
		n := float64(len(ids) / batch * batch)
		return trial{name, func() (float64, error) {
			step++
			d, err := parallelBatches(goroutines, ids, batch, dim, fn)
			return n / d, err
		}}
	}
	// Connect every client (handshakes, first buffers) before measuring.
	for _, fn := range []func(g int, b []uint64, out []float32) error{
		pull(clients), pull(encClients), pull(plainClients), red.pull, grpcPull, grpcTLSPull,
	} {
		if _, err := parallelBatches(goroutines, zipf[:goroutines*batch], batch, dim, fn); err != nil {
			return err
		}
	}

	runtime.GC() // the garbage of filling and loading, collected before anything is timed
	fmt.Printf("ps: pulls by frame protection...\n")
	prot, err := interleave(ctx, rounds, nil,
		on("unprotected", zipf, pull(plainClients)),
		on("integrity", zipf, pull(clients)),
		on("encrypted", zipf, pull(encClients)))
	if err != nil {
		return err
	}
	fmt.Printf("ps: pulls against the local table, Zipf and all-distinct batches...\n")
	loc, err := interleave(ctx, rounds, nil, on("pull", zipf, pull(clients)), on("local", zipf, localPull))
	if err != nil {
		return err
	}
	locD, err := interleave(ctx, rounds, nil, on("pull", distinct, pull(clients)), on("local", distinct, localPull))
	if err != nil {
		return err
	}
	// Our default (integrity) and our unprotected wire against each peer in the same rounds.
	fmt.Printf("ps: pulls against Redis and gRPC...\n")
	rd, err := interleave(ctx, rounds, nil, on("pull", zipf, pull(clients)), on("pull_unprotected", zipf, pull(plainClients)), on("redis", zipf, red.pull))
	if err != nil {
		return err
	}
	gr, err := interleave(ctx, rounds, nil, on("pull", zipf, pull(clients)), on("pull_unprotected", zipf, pull(plainClients)), on("grpc", zipf, grpcPull))
	if err != nil {
		return err
	}
	fmt.Printf("ps: pulls against gRPC over TLS...\n")
	gs, err := interleave(ctx, rounds, nil, on("pull", zipf, pull(clients)), on("pull_encrypted", zipf, pull(encClients)), on("grpc_tls", zipf, grpcTLSPull))
	if err != nil {
		return err
	}
	fmt.Printf("ps: pushes against gRPC...\n")
	pu, err := interleave(ctx, rounds, nil, on("pull", zipf, pull(clients)), on("push", zipf, push(clients)),
		on("push_unprotected", zipf, push(plainClients)), on("grpc_push", zipf, grpcPush))
	if err != nil {
		return err
	}

	pl := prot.median("integrity")
	setup := fmt.Sprintf("%d goroutines, %d servers, batches of %d", goroutines, servers, batch)
	r.add("pull_rows_per_s", pl, "rows/s (positions) through the TCP client with frame integrity (the default), Zipf(1.1) ids, "+setup)
	r.add("pull_encrypted_rows_per_s", prot.median("encrypted"), "rows/s of the same pulls with frames encrypted")
	r.add("pull_unprotected_rows_per_s", prot.median("unprotected"), "rows/s of the same pulls with frames unprotected (measurement only)")
	r.addRatio("pull_integrity_vs_unprotected", prot.ratio("integrity", "unprotected"), "the same pulls unprotected", "pull_unprotected_rows_per_s", "cost of frame integrity; target >= 0.9")
	r.addRatio("pull_encrypted_vs_unprotected", prot.ratio("encrypted", "unprotected"), "the same pulls unprotected", "pull_unprotected_rows_per_s", "cost of frame encryption")
	localNote := "the same batches straight on an embedding.Table: repeated ids folded, the distinct rows looked up, copied to every position"
	r.add("local_rows_per_s", loc.median("local"), "rows/s of "+localNote)
	r.addRatio("pull_vs_local", loc.ratio("pull", "local"), "local_rows_per_s: "+localNote, "local_rows_per_s", "cost of the network path (with integrity), Zipf(1.1) batches")
	r.add("local_distinct_rows_per_s", locD.median("local"), "rows/s of the local lookups on all-distinct batches (Zipf(1.1) ids, repeats within a batch redrawn)")
	r.add("pull_distinct_rows_per_s", locD.median("pull"), "rows/s of pulls of the all-distinct batches")
	r.addRatio("pull_vs_local_distinct", locD.ratio("pull", "local"), "local_distinct_rows_per_s", "local_distinct_rows_per_s", "the same on all-distinct batches; target >= 0.7")
	redNote := fmt.Sprintf("Redis %s in plaintext without AUTH, one instance per server holding that server's rows, %d connections per goroutine and instance, the batch's distinct ids by pipelined MGET to every instance at once, each value read into place with one copy", red.version, psConns)
	r.add("redis_rows_per_s", rd.median("redis"), "rows/s from "+redNote)
	r.addRatio("pull_vs_redis", rd.ratio("pull", "redis"), "redis_rows_per_s: "+redNote, "redis_rows_per_s", "our default (integrity) against plaintext Redis; target >= 2")
	r.addRatio("pull_vs_redis_unprotected", rd.ratio("pull_unprotected", "redis"), "redis_rows_per_s: "+redNote, "redis_rows_per_s",
		"our pulls unprotected against plaintext Redis, like with like, in the same rounds")
	grpcNote := fmt.Sprintf("grpc-go %s unary Pull(ids)->bytes and Push over the same tables, one server per ps server, %d connections per goroutine and server, windows %d MiB, the batch's distinct ids to every server at once", grpcVersion, psConns, grpcWindow>>20)
	r.add("grpc_pull_rows_per_s", gr.median("grpc"), "rows/s from "+grpcNote)
	r.addRatio("pull_vs_grpc", gr.ratio("pull", "grpc"), "grpc_pull_rows_per_s: "+grpcNote+", insecure", "grpc_pull_rows_per_s", "our default (integrity) against insecure gRPC; target >= 1.5")
	r.addRatio("pull_vs_grpc_unprotected", gr.ratio("pull_unprotected", "grpc"), "grpc_pull_rows_per_s: "+grpcNote+", insecure", "grpc_pull_rows_per_s",
		"our pulls unprotected against insecure gRPC, like with like, in the same rounds")
	tlsNote := fmt.Sprintf("the same gRPC peer over TLS (%s, self-signed certificate made in process)", gt.suite)
	r.add("grpc_tls_pull_rows_per_s", gs.median("grpc_tls"), "rows/s from "+tlsNote)
	r.addRatio("pull_encrypted_vs_grpc_tls", gs.ratio("pull_encrypted", "grpc_tls"), "grpc_tls_pull_rows_per_s: "+tlsNote, "grpc_tls_pull_rows_per_s",
		"our pulls encrypted (AES-256-GCM) against gRPC over TLS, like with like")
	r.addRatio("pull_vs_grpc_tls", gs.ratio("pull", "grpc_tls"), "grpc_tls_pull_rows_per_s: "+tlsNote, "grpc_tls_pull_rows_per_s",
		"our default (integrity only) against gRPC over TLS (which also encrypts)")
	r.add("push_rows_per_s", pu.median("push"), "rows/s (positions) of Adagrad pushes through the TCP client")
	r.addRatio("push_vs_pull", pu.ratio("push", "pull"), "pulls of the same batches", "pull_rows_per_s", "target >= 0.5")
	r.add("grpc_push_rows_per_s", pu.median("grpc_push"), "rows/s of the same pushes through the gRPC peer (gradients of repeated ids summed first, as our client does)")
	r.addRatio("push_vs_grpc", pu.ratio("push", "grpc_push"), "grpc_push_rows_per_s: insecure gRPC", "grpc_push_rows_per_s", "our push (integrity) over gRPC's push of the same batches")
	r.addRatio("push_vs_grpc_unprotected", pu.ratio("push_unprotected", "grpc_push"), "grpc_push_rows_per_s: insecure gRPC", "grpc_push_rows_per_s",
		"our push unprotected over gRPC's push of the same batches, like with like, in the same rounds")
	r.add("table_rows", float64(rows), fmt.Sprintf("rows x dim %d over %d servers", dim, servers))

	n8, _ := ps.NewOwnerTable(1, ps.DefaultSlots, benchNodes(8), nil)
	n9, _ := ps.NewOwnerTable(2, ps.DefaultSlots, benchNodes(9), n8)
	r.add("moved_fraction_n8_to_n9", float64(len(n8.Moves(n9)))/float64(ps.DefaultSlots), "slots moved adding a 9th server; ideal 1/9 = 0.111")
	r.add("max_over_avg_load_n8", n8.MaxOverAvgLoad(), "slots per server, max over average; bound 1.1 by construction")
	// What the placement does to traffic: rows served per server under Zipf(1.1) ids.
	served := make([]float64, len(n8.Nodes))
	for _, rank := range zipfStream(rows, 1<<20, 11) {
		served[n8.OwnerIndex(embedding.Slot(rankID(rank), n8.Slots))]++
	}
	var most, total float64
	for _, v := range served {
		most, total = max(most, v), total+v
	}
	r.add("max_over_avg_traffic_n8", most*float64(len(served))/total, "rows served per server under Zipf(1.1) ids over 8 servers, max over average")

	// How cost grows: pull rate against the batch size on this cluster.
	sizes := []int{256, 1024, 4096, 16384}
	if opt.quick {
		sizes = []int{256, 4096}
	}
	var bt []trial
	for _, b := range sizes {
		ids := zipf[:len(zipf)/b*b]
		fn := pull(clients)
		bt = append(bt, trial{fmt.Sprint(b), func() (float64, error) {
			d, err := parallelBatches(goroutines, ids, b, dim, fn)
			return float64(len(ids)) / d, err
		}})
	}
	fmt.Printf("ps: pull rate against batch size...\n")
	bs, err := interleave(ctx, rounds, nil, bt...)
	if err != nil {
		return err
	}
	byBatch := sweepTable{About: fmt.Sprintf("pull rows/s (integrity) against ids per batch, Zipf(1.1), %d goroutines, %d servers, %d rows", goroutines, servers, rows),
		Columns: []string{"batch", "pull_rows_per_s"}}
	for _, b := range sizes {
		byBatch.Rows = append(byBatch.Rows, []float64{float64(b), bs.median(fmt.Sprint(b))})
	}
	r.addTable("pull_by_batch", byBatch)
	red.stop()
	gp.stop()
	gt.stop()
	closeClients(clients)
	closeClients(encClients)
	closeClients(plainClients)
	cl.close()
	local = nil

	// ... and against the number of servers holding the same rows.
	counts, sweepRows := []int{1, 2, 4}, 2<<20
	if opt.quick {
		counts, sweepRows = []int{1, 2}, 1<<16
	}
	byServers := sweepTable{About: fmt.Sprintf("pull rows/s (integrity) against servers holding the same %d rows, Zipf(1.1) batches of %d, %d goroutines, servers in this process", sweepRows, batch, goroutines),
		Columns: []string{"servers", "pull_rows_per_s", "push_rows_per_s"}}
	for _, n := range counts {
		fmt.Printf("ps: pull rate on %d servers...\n", n)
		p, q, err := psServerPoint(ctx, n, tcfg, sweepRows, batch, goroutines, rounds, batchesPerRound)
		if err != nil {
			return err
		}
		byServers.Rows = append(byServers.Rows, []float64{float64(n), p, q})
	}
	r.addTable("pull_by_servers", byServers)
	return nil
}

// psServerPoint measures pulls and pushes on a cluster of n servers holding rows rows.
func psServerPoint(ctx context.Context, n int, tcfg embedding.Config, rows, batch, goroutines, rounds, batchesPerRound int) (pull, push float64, err error) {
	cl, err := startCluster(n, tcfg)
	if err != nil {
		return 0, 0, err
	}
	defer cl.close()
	if err := cl.fill(rows, nil); err != nil {
		return 0, 0, err
	}
	cs, err := cl.clients(goroutines, ps.ProtectIntegrity)
	if err != nil {
		return 0, 0, err
	}
	defer closeClients(cs)
	ids := rankIDs(zipfStream(rows, batch*batchesPerRound, 7))
	grads := make([]float32, batch*tcfg.Dim)
	step := uint64(0)
	pullFn := func(g int, b []uint64, out []float32) error { return cs[g].Pull(ctx, "emb", b, out) }
	pushFn := func(g int, b []uint64, out []float32) error { return cs[g].Push(ctx, "emb", b, grads, step) }
	if _, err := parallelBatches(goroutines, ids[:goroutines*batch], batch, tcfg.Dim, pullFn); err != nil {
		return 0, 0, err
	}
	nIDs := float64(len(ids) / batch * batch)
	smp, err := interleave(ctx, rounds, nil,
		trial{"pull", func() (float64, error) {
			d, err := parallelBatches(goroutines, ids, batch, tcfg.Dim, pullFn)
			return nIDs / d, err
		}},
		trial{"push", func() (float64, error) {
			step++
			d, err := parallelBatches(goroutines, ids, batch, tcfg.Dim, pushFn)
			return nIDs / d, err
		}})
	if err != nil {
		return 0, 0, err
	}
	return smp.median("pull"), smp.median("push"), nil
}

// parallelBatches runs fn over the batches of ids on goroutines goroutines, each taking every
// goroutines-th batch, and returns the wall time in seconds.
func parallelBatches(goroutines int, ids []uint64, batch, dim int, fn func(g int, ids []uint64, out []float32) error) (float64, error) {
	var wg sync.WaitGroup
	errs := make([]error, goroutines)
	outs := make([][]float32, goroutines)
	for g := range outs {
		outs[g] = make([]float32, batch*dim)
	}
	start := time.Now()
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for b := g * batch; b+batch <= len(ids); b += goroutines * batch {
				if err := fn(g, ids[b:b+batch], outs[g]); err != nil {
					errs[g] = err
					return
				}
			}
		}(g)
	}
	wg.Wait()
	return time.Since(start).Seconds(), errors.Join(errs...)
}

// psCluster is parameter servers serving one table "emb" on loopback TCP in this process.
type psCluster struct {
	secret []byte
	srvs   []*ps.Server
	table  *ps.OwnerTable
	holder *ps.TableHolder
	wg     sync.WaitGroup
	once   sync.Once
}

func startCluster(n int, tcfg embedding.Config) (*psCluster, error) {
	cl := &psCluster{secret: make([]byte, 32), holder: &ps.TableHolder{}}
	rand.Read(cl.secret)
	var nodes []ps.Node
	for i := 0; i < n; i++ {
		srv, err := ps.NewServer(ps.ServerConfig{ID: fmt.Sprintf("ps-%d", i), Secret: cl.secret, Tables: []ps.TableSpec{{Name: "emb", Config: tcfg}},
			Protection: ps.ProtectNone}) // each client chooses: the protection it asks for is used
		if err != nil {
			cl.close()
			return nil, err
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			srv.Close()
			cl.close()
			return nil, err
		}
		cl.wg.Add(1)
		go func() { defer cl.wg.Done(); srv.Serve(l) }()
		cl.srvs = append(cl.srvs, srv)
		nodes = append(nodes, ps.Node{ID: srv.ID(), Addr: l.Addr().String()})
	}
	table, err := ps.NewOwnerTable(1, ps.DefaultSlots, nodes, nil)
	if err != nil {
		cl.close()
		return nil, err
	}
	for _, s := range cl.srvs {
		s.SetOwnerTable(table)
	}
	cl.table = table
	cl.holder.Set(table)
	return cl, nil
}

func (cl *psCluster) close() {
	cl.once.Do(func() {
		for _, s := range cl.srvs {
			s.Close()
		}
		cl.wg.Wait()
	})
}

// owner returns the index of the server that holds id.
func (cl *psCluster) owner(id uint64) int {
	return cl.table.OwnerIndex(embedding.Slot(id, cl.table.Slots))
}

// fill creates rows rows (ranks 0..rows-1, in rank order) on their servers, and in local if not nil.
func (cl *psCluster) fill(rows int, local *embedding.Table) error {
	const batch = 4096
	dim := 0
	tabs := make([]*embedding.Table, len(cl.srvs))
	for i, s := range cl.srvs {
		t, ok := s.Table("emb")
		if !ok {
			return errors.New("ps bench: server has no table emb")
		}
		tabs[i], dim = t, t.Dim()
	}
	all := make([]uint64, batch)
	buf := make([]float32, batch*dim)
	byOwner := make([][]uint64, len(cl.srvs))
	for base := 0; base < rows; base += batch {
		part := all[:min(batch, rows-base)]
		for i := range part {
			part[i] = rankID(uint64(base + i))
		}
		if local != nil {
			if err := local.Lookup(part, buf[:len(part)*dim]); err != nil {
				return err
			}
		}
		for i := range byOwner {
			byOwner[i] = byOwner[i][:0]
		}
		for _, id := range part {
			o := cl.owner(id)
			byOwner[o] = append(byOwner[o], id)
		}
		for i, t := range tabs {
			if err := t.Lookup(byOwner[i], buf[:len(byOwner[i])*dim]); err != nil {
				return err
			}
		}
	}
	return nil
}

// clients returns one client per goroutine asking for protection p.
func (cl *psCluster) clients(n int, p ps.Protection) ([]*ps.Client, error) {
	cs := make([]*ps.Client, n)
	for g := range cs {
		c, err := ps.NewClient(ps.ClientConfig{Secret: cl.secret, Resolver: cl.holder, Protection: p, ConnsPerAddr: psConns})
		if err != nil {
			closeClients(cs)
			return nil, err
		}
		cs[g] = c
	}
	return cs, nil
}

func closeClients(cs []*ps.Client) {
	for _, c := range cs {
		if c != nil {
			c.Close()
		}
	}
}

func benchNodes(n int) []ps.Node {
	out := make([]ps.Node, n)
	for i := range out {
		out[i] = ps.Node{ID: fmt.Sprintf("ps-%d", i)}
	}
	return out
}

// rankIDs maps popularity ranks to ids.
func rankIDs(ranks []uint64) []uint64 {
	ids := make([]uint64, len(ranks))
	for i, rank := range ranks {
		ids[i] = rankID(rank)
	}
	return ids
}

// distinctZipfStream returns batches batches of batch ranks drawn from Zipf(1.1) over rows, a rank
// drawn again within its batch redrawn: every batch is all distinct.
func distinctZipfStream(rows, batch, batches int, seed uint64) []uint64 {
	src := zipfStream(rows, 1<<16, seed)
	out := make([]uint64, 0, batch*batches)
	seen := make(map[uint64]bool, batch)
	for k := 0; len(out) < batch*batches; k++ {
		if k == len(src) {
			src, k = zipfStream(rows, 1<<16, seed+uint64(len(out))), 0
		}
		if len(out)%batch == 0 {
			clear(seen)
		}
		if rank := src[k]; !seen[rank] {
			seen[rank] = true
			out = append(out, rank)
		}
	}
	return out
}

// folder folds the repeated ids of a batch as well as it can be done: an open-addressing table
// sized for the batch, one probe per id in the common case.
type folder struct {
	slots []int32 // index into uniq + 1; 0 = empty
	uniq  []uint64
	first []int32 // index into uniq -> first position of that id
	at    []int32 // position -> index into uniq
	rows  []float32
	mask  uint64
}

func newFolder(batch, dim int) *folder {
	n := 1
	for n < 2*batch {
		n <<= 1
	}
	return &folder{slots: make([]int32, n), mask: uint64(n - 1), uniq: make([]uint64, 0, batch), first: make([]int32, 0, batch),
		at: make([]int32, batch), rows: make([]float32, batch*dim)}
}

// fold fills f.uniq with the distinct ids of ids in first-seen order and f.at with the index of
// each position's id in f.uniq.
func (f *folder) fold(ids []uint64) {
	if len(f.at) < len(ids) {
		*f = *newFolder(len(ids), len(f.rows)/len(f.at))
	}
	clear(f.slots)
	f.uniq, f.first = f.uniq[:0], f.first[:0]
	for p, id := range ids {
		h := (id * 0x9e3779b97f4a7c15) >> 20
		for {
			h &= f.mask
			e := f.slots[h]
			if e == 0 {
				f.uniq = append(f.uniq, id)
				f.first = append(f.first, int32(p))
				f.slots[h] = int32(len(f.uniq))
				f.at[p] = int32(len(f.uniq) - 1)
				break
			}
			if f.uniq[e-1] == id {
				f.at[p] = e - 1
				break
			}
			h++
		}
	}
}

// lookup is the local baseline of a pull: the distinct rows looked up once each (straight into dst
// when the batch has no repeats), then copied to every position.
func (f *folder) lookup(t *embedding.Table, ids []uint64, dst []float32) error {
	f.fold(ids)
	if len(f.uniq) == len(ids) {
		return t.Lookup(ids, dst)
	}
	dim := len(dst) / len(ids)
	rows := f.rows[:len(f.uniq)*dim]
	if err := t.Lookup(f.uniq, rows); err != nil {
		return err
	}
	for p, u := range f.at[:len(ids)] {
		copy(dst[p*dim:(p+1)*dim], rows[int(u)*dim:int(u+1)*dim])
	}
	return nil
}

// spread copies each distinct id's row, already at its first position in dst, to the id's other
// positions.
func (f *folder) spread(dst []float32, n, dim int) {
	for p, u := range f.at[:n] {
		if q := int(f.first[u]); q != p {
			copy(dst[p*dim:(p+1)*dim], dst[q*dim:(q+1)*dim])
		}
	}
}

// sumGrads fills f.rows with the gradient of each distinct id, summed over its positions.
func (f *folder) sumGrads(grads []float32, n, dim int) []float32 {
	sum := f.rows[:len(f.uniq)*dim]
	for u, p := range f.first {
		copy(sum[u*dim:(u+1)*dim], grads[int(p)*dim:int(p+1)*dim])
	}
	for p, u := range f.at[:n] {
		if int(f.first[u]) != p {
			s, g := sum[int(u)*dim:int(u+1)*dim], grads[p*dim:(p+1)*dim]
			for j := range s {
				s[j] += g[j]
			}
		}
	}
	return sum
}
