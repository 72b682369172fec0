package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
)

// runPS measures pulls and pushes through the TCP client against two in-process servers, the same
// lookups straight on an embedding.Table, and Redis serving the same rows with pipelined MGET.
// Pulls run with each frame protection: integrity (the default), encryption, and none, which the
// servers here accept for this measurement only (a connection is unprotected only if both ends
// ask), so the cost of protection is a ratio measured in the same run.
func runPS(ctx context.Context, opt options, r *report) error {
	const dim, batch, servers, goroutines = 64, 4096, 2, 2
	perServer := 4 << 20
	rounds, batchesPerRound := 5, 120
	if opt.quick {
		perServer, rounds, batchesPerRound = 1<<17, 2, 12
	}
	rows := perServer * servers
	secret := make([]byte, 32)
	rand.Read(secret)
	tcfg := embedding.Config{Dim: dim, Seed: 1, Optimizer: embedding.Optimizer{Kind: embedding.Adagrad}}
	var nodes []ps.Node
	var srvs []*ps.Server
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; i < servers; i++ {
		srv, err := ps.NewServer(ps.ServerConfig{ID: fmt.Sprintf("ps-%d", i), Secret: secret, Tables: []ps.TableSpec{{Name: "emb", Config: tcfg}},
			Protection: ps.ProtectNone}) // each client chooses: the protection it asks for is used
		if err != nil {
			return err
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); srv.Serve(l) }()
		defer srv.Close()
		srvs = append(srvs, srv)
		nodes = append(nodes, ps.Node{ID: srv.ID(), Addr: l.Addr().String()})
	}
	table, err := ps.NewOwnerTable(1, ps.DefaultSlots, nodes, nil)
	if err != nil {
		return err
	}
	for _, s := range srvs {
		s.SetOwnerTable(table)
	}
	holder := &ps.TableHolder{}
	holder.Set(table)

	fmt.Printf("ps: filling %d rows on %d servers and a local table of the same rows...\n", rows, servers)
	local, err := embedding.New(tcfg)
	if err != nil {
		return err
	}
	all := make([]uint64, batch)
	buf := make([]float32, batch*dim)
	byOwner := make([][]uint64, servers)
	for base := 0; base < rows; base += batch {
		for i := range all {
			all[i] = rankID(uint64(base + i))
		}
		if err := local.Lookup(all, buf); err != nil {
			return err
		}
		for i := range byOwner {
			byOwner[i] = byOwner[i][:0]
		}
		for _, id := range all {
			o := table.OwnerIndex(embedding.Slot(id, table.Slots))
			byOwner[o] = append(byOwner[o], id)
		}
		for i, s := range srvs {
			t, _ := s.Table("emb")
			if err := t.Lookup(byOwner[i], buf[:len(byOwner[i])*dim]); err != nil {
				return err
			}
		}
	}
	stream := zipfStream(rows, batch*batchesPerRound, 7)
	ids := make([]uint64, len(stream))
	for i, rank := range stream {
		ids[i] = rankID(rank)
	}

	// One client per goroutine and protection.
	newClients := func(p ps.Protection) ([]*ps.Client, error) {
		cs := make([]*ps.Client, goroutines)
		for g := range cs {
			c, err := ps.NewClient(ps.ClientConfig{Secret: secret, Resolver: holder, Protection: p})
			if err != nil {
				return nil, err
			}
			cs[g] = c
		}
		return cs, nil
	}
	clients, err := newClients(ps.ProtectIntegrity)
	if err != nil {
		return err
	}
	encClients, err := newClients(ps.ProtectEncrypt)
	if err != nil {
		return err
	}
	plainClients, err := newClients(ps.ProtectNone)
	if err != nil {
		return err
	}
	defer func() {
		for _, cs := range [][]*ps.Client{clients, encClients, plainClients} {
			for _, c := range cs {
				c.Close()
			}
		}
	}()
	grads := make([]float32, batch*dim)
	for i := range grads {
		grads[i] = 1e-4
	}
	// Each goroutine takes every goroutines-th batch of the stream.
	parallel := func(fn func(g int, ids []uint64, out []float32) error) (float64, error) {
		var wg sync.WaitGroup
		errs := make([]error, goroutines)
		start := time.Now()
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				out := make([]float32, batch*dim)
				for b := g * batch; b+batch <= len(ids); b += goroutines * batch {
					if err := fn(g, ids[b:b+batch], out); err != nil {
						errs[g] = err
						return
					}
				}
			}(g)
		}
		wg.Wait()
		return float64(len(ids)/batch*batch) / time.Since(start).Seconds(), errors.Join(errs...)
	}

	red, redisNote := startRedis(ctx, opt, ids, local, dim)
	if red != nil {
		defer red.stop()
	}
	var pullT, encT, plainT, localT, redisT, pushT []float64
	pulls := []struct {
		clients []*ps.Client
		rates   *[]float64
	}{{plainClients, &plainT}, {clients, &pullT}, {encClients, &encT}}
	// Connect every client (handshakes, first buffers) before measuring.
	for _, p := range pulls {
		if _, err := parallel(func(g int, b []uint64, out []float32) error { return p.clients[g].Pull(ctx, "emb", b, out) }); err != nil {
			return err
		}
	}
	for round := 0; round < rounds; round++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The three protections in a rotating order, so none always runs first.
		for i := range pulls {
			p := pulls[(round+i)%len(pulls)]
			v, err := parallel(func(g int, b []uint64, out []float32) error { return p.clients[g].Pull(ctx, "emb", b, out) })
			if err != nil {
				return err
			}
			*p.rates = append(*p.rates, v)
		}
		v, err := parallel(func(g int, b []uint64, out []float32) error { return local.Lookup(b, out) })
		if err != nil {
			return err
		}
		localT = append(localT, v)
		if red != nil {
			v, err = parallel(func(g int, b []uint64, out []float32) error { return red.conns[g].mget(b, out) })
			if err != nil {
				return fmt.Errorf("redis: %w", err)
			}
			redisT = append(redisT, v)
		}
		v, err = parallel(func(g int, b []uint64, out []float32) error {
			return clients[g].Push(ctx, "emb", b, grads, uint64(round))
		})
		if err != nil {
			return err
		}
		pushT = append(pushT, v)
	}
	pull, enc, plain, loc, push := median(pullT), median(encT), median(plainT), median(localT), median(pushT)
	r.add("pull_rows_per_s", pull, fmt.Sprintf("rows/s through the TCP client with frame integrity (the default), %d goroutines, %d servers, batches of %d", goroutines, servers, batch))
	r.add("pull_encrypted_rows_per_s", enc, "rows/s of the same pulls with frames encrypted")
	r.add("pull_unprotected_rows_per_s", plain, "rows/s of the same pulls with frames unprotected (measurement only)")
	r.add("pull_integrity_vs_unprotected", pull/plain, "cost of frame integrity; target >= 0.9")
	r.add("pull_encrypted_vs_unprotected", enc/plain, "cost of frame encryption")
	r.add("local_rows_per_s", loc, "rows/s of the same lookups straight on an embedding.Table")
	r.add("pull_vs_local", pull/loc, "cost of the network path (with integrity)")
	if red != nil {
		rd := median(redisT)
		r.add("redis_rows_per_s", rd, "rows/s from Redis, pipelined MGET of 4096 256-byte values, same goroutines")
		r.add("pull_vs_redis", pull/rd, "target >= 2")
	} else {
		fmt.Printf("ps: Redis comparison skipped: %s\n", redisNote)
	}
	r.add("push_rows_per_s", push, "rows/s of Adagrad pushes through the TCP client")
	r.add("push_vs_pull", push/pull, "target >= 0.5")
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
	return nil
}

func benchNodes(n int) []ps.Node {
	out := make([]ps.Node, n)
	for i := range out {
		out[i] = ps.Node{ID: fmt.Sprintf("ps-%d", i)}
	}
	return out
}

// redisPeer is a redis-server started for the benchmark, holding the same rows.
type redisPeer struct {
	cmd   *exec.Cmd
	dir   string
	conns []*respConn
}

func (p *redisPeer) stop() {
	for _, c := range p.conns {
		c.c.Close()
	}
	p.cmd.Process.Kill()
	p.cmd.Wait()
	os.RemoveAll(p.dir)
}

// startRedis starts redis-server on a free loopback port, loads the rows the stream touches (as
// 256-byte binary values keyed by the 8-byte id) and opens one connection per goroutine. It
// returns nil and a reason when Redis is not available.
func startRedis(ctx context.Context, opt options, ids []uint64, local *embedding.Table, dim int) (*redisPeer, string) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "redis-server is not installed (Debian package redis-server)"
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err.Error()
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp(opt.dir, "bench-redis-")
	if err != nil {
		return nil, err.Error()
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err.Error()
	}
	p := &redisPeer{cmd: cmd, dir: dir}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for i := 0; i < 2; i++ {
		var c net.Conn
		for try := 0; try < 100; try++ { // redis-server takes a moment to listen
			if c, err = net.Dial("tcp", addr); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			p.stop()
			return nil, "redis-server did not start: " + err.Error()
		}
		p.conns = append(p.conns, newRESP(c))
	}
	// Load every distinct id of the stream with its current row.
	seen := map[uint64]bool{}
	var batchIDs []uint64
	row := make([]float32, 4096*dim)
	flush := func() error {
		if len(batchIDs) == 0 {
			return nil
		}
		if err := local.Lookup(batchIDs, row[:len(batchIDs)*dim]); err != nil {
			return err
		}
		err := p.conns[0].mset(batchIDs, row[:len(batchIDs)*dim], dim)
		batchIDs = batchIDs[:0]
		return err
	}
	fmt.Printf("ps: loading the stream's rows into Redis at %s...\n", addr)
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		batchIDs = append(batchIDs, id)
		if len(batchIDs) == 4096 {
			if err := flush(); err != nil {
				p.stop()
				return nil, err.Error()
			}
		}
	}
	if err := flush(); err != nil {
		p.stop()
		return nil, err.Error()
	}
	return p, ""
}

// respConn speaks just enough of the Redis protocol for pipelined MSET and MGET of binary values,
// parsing replies straight into the caller's floats (no per-value allocation, so the peer is
// measured at its best).
type respConn struct {
	c   net.Conn
	r   *bufio.Reader
	w   *bufio.Writer
	hdr []byte
}

func newRESP(c net.Conn) *respConn {
	return &respConn{c: c, r: bufio.NewReaderSize(c, 1<<20), w: bufio.NewWriterSize(c, 1<<20)}
}

func (c *respConn) bulk(b []byte) {
	c.hdr = append(c.hdr[:0], '$')
	c.hdr = strconv.AppendInt(c.hdr, int64(len(b)), 10)
	c.hdr = append(c.hdr, '\r', '\n')
	c.w.Write(c.hdr)
	c.w.Write(b)
	c.w.WriteString("\r\n")
}

func (c *respConn) array(n int) {
	c.hdr = append(c.hdr[:0], '*')
	c.hdr = strconv.AppendInt(c.hdr, int64(n), 10)
	c.hdr = append(c.hdr, '\r', '\n')
	c.w.Write(c.hdr)
}

func (c *respConn) key(id uint64) {
	var k [8]byte
	binary.LittleEndian.PutUint64(k[:], id)
	c.bulk(k[:])
}

func (c *respConn) mset(ids []uint64, rows []float32, dim int) error {
	c.array(1 + 2*len(ids))
	c.bulk([]byte("MSET"))
	val := make([]byte, 4*dim)
	for i, id := range ids {
		c.key(id)
		for j := 0; j < dim; j++ {
			binary.LittleEndian.PutUint32(val[4*j:], math.Float32bits(rows[i*dim+j]))
		}
		c.bulk(val)
	}
	if err := c.w.Flush(); err != nil {
		return err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if len(line) == 0 || line[0] != '+' {
		return fmt.Errorf("MSET answered %q", line)
	}
	return nil
}

// mget reads the rows of ids into out (len(ids)*dim).
func (c *respConn) mget(ids []uint64, out []float32) error {
	c.array(1 + len(ids))
	c.bulk([]byte("MGET"))
	for _, id := range ids {
		c.key(id)
	}
	if err := c.w.Flush(); err != nil {
		return err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(string(line[1 : len(line)-2])); err != nil || line[0] != '*' || n != len(ids) {
		return fmt.Errorf("MGET answered %q", line)
	}
	dim := len(out) / len(ids)
	val := make([]byte, 4*dim+2)
	for i := range ids {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if n, err := strconv.Atoi(string(line[1 : len(line)-2])); err != nil || line[0] != '$' || n != 4*dim {
			return fmt.Errorf("MGET value %q", line)
		}
		if _, err := io.ReadFull(c.r, val); err != nil {
			return err
		}
		for j := 0; j < dim; j++ {
			out[i*dim+j] = math.Float32frombits(binary.LittleEndian.Uint32(val[4*j:]))
		}
	}
	return nil
}
