package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/elasticps/elasticps/embedding"
)

// The peers of the ps suite: the systems users deploy instead of our wire, each doing the same
// work as our client (the batch's distinct ids, split by owner, every server asked at once, each
// row copied to every position that asked for it) and tuned as its users tune it.

// floatBytes returns the bytes of v (little-endian on the machines this runs on).
func floatBytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}

// split fills parts[o] with the indices into f.uniq of the ids owner o holds.
func split(parts [][]int32, f *folder, owner func(uint64) int) {
	for i := range parts {
		parts[i] = parts[i][:0]
	}
	for u, id := range f.uniq {
		o := owner(id)
		parts[o] = append(parts[o], int32(u))
	}
}

// ---- Redis ----

// redisServerPath finds redis-server, the ps suite's Redis baseline.
func redisServerPath() (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redis-server is not installed; the ps suite compares pulls with Redis and does not run without it (Debian: apt-get install redis-server)")
	}
	return bin, nil
}

// redisPeer is one redis-server per ps server, each holding the rows its server holds, and
// psConns connections per goroutine and instance.
type redisPeer struct {
	version string
	cmds    []*exec.Cmd
	dirs    []string
	conns   [][][]*respConn // [goroutine][instance][k]
	calls   []int           // per goroutine: calls made, to take the connections in turn
	folders []*folder
	parts   [][][]int32
	owner   func(uint64) int
	dim     int
	once    sync.Once
}

func (p *redisPeer) stop() {
	p.once.Do(func() {
		for _, g := range p.conns {
			for _, inst := range g {
				for _, c := range inst {
					c.c.Close()
				}
			}
		}
		for _, cmd := range p.cmds {
			cmd.Process.Kill()
			cmd.Wait()
		}
		for _, d := range p.dirs {
			os.RemoveAll(d)
		}
	})
}

// startRedis starts one redis-server per server of cl on free loopback ports (no persistence),
// loads the rows the streams touch into the instance of their owner (256-byte binary values keyed
// by the 8-byte id) and opens the connections.
func startRedis(ctx context.Context, opt options, bin string, cl *psCluster, goroutines int, local *embedding.Table, dim int, streams ...[]uint64) (*redisPeer, error) {
	p := &redisPeer{owner: cl.owner, dim: dim}
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		if m := regexp.MustCompile(`v=(\S+)`).FindSubmatch(out); m != nil {
			p.version = string(m[1])
		}
	}
	n := len(cl.srvs)
	addrs := make([]string, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			p.stop()
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		dir, err := os.MkdirTemp(opt.dir, "bench-redis-")
		if err != nil {
			p.stop()
			return nil, err
		}
		p.dirs = append(p.dirs, dir)
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--protected-mode", "no")
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			p.stop()
			return nil, err
		}
		p.cmds = append(p.cmds, cmd)
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	dial := func(addr string) (*respConn, error) {
		var err error
		for try := 0; try < 100; try++ { // redis-server takes a moment to listen
			var c net.Conn
			if c, err = net.Dial("tcp", addr); err == nil {
				return newRESP(c), nil
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil, fmt.Errorf("redis-server at %s did not start: %w", addr, err)
	}
	p.conns = make([][][]*respConn, goroutines)
	for g := range p.conns {
		p.conns[g] = make([][]*respConn, n)
		for i, addr := range addrs {
			for range psConns {
				c, err := dial(addr)
				if err != nil {
					p.stop()
					return nil, err
				}
				p.conns[g][i] = append(p.conns[g][i], c)
			}
		}
		p.folders = append(p.folders, newFolder(4096, dim))
		p.parts = append(p.parts, make([][]int32, n))
	}
	p.calls = make([]int, goroutines)

	// Load every distinct id of the streams with its current row into its owner's instance.
	fmt.Printf("ps: loading the streams' rows into %d Redis instances...\n", n)
	seen := map[uint64]bool{}
	pending := make([][]uint64, n)
	row := make([]float32, 4096*dim)
	flush := func(i int) error {
		ids := pending[i]
		if len(ids) == 0 {
			return nil
		}
		if err := local.Lookup(ids, row[:len(ids)*dim]); err != nil {
			return err
		}
		pending[i] = ids[:0]
		return p.conns[0][i][0].mset(ids, row[:len(ids)*dim], dim)
	}
	for _, s := range streams {
		for _, id := range s {
			if seen[id] {
				continue
			}
			seen[id] = true
			o := cl.owner(id)
			pending[o] = append(pending[o], id)
			if len(pending[o]) == 4096 {
				if err := flush(o); err != nil {
					p.stop()
					return nil, err
				}
			}
		}
		if ctx.Err() != nil {
			p.stop()
			return nil, ctx.Err()
		}
	}
	for i := range pending {
		if err := flush(i); err != nil {
			p.stop()
			return nil, err
		}
	}
	return p, nil
}

// pull reads the rows of ids into out (len(ids)*dim) as a Redis user does it at its best: the
// distinct ids, one MGET to each instance written before any answer is read (the instances work at
// once), each value read straight into its first position with one copy, then copied to the
// other positions of its id.
func (p *redisPeer) pull(g int, ids []uint64, out []float32) error {
	f, parts := p.folders[g], p.parts[g]
	f.fold(ids)
	split(parts, f, p.owner)
	k := p.calls[g] % psConns
	p.calls[g]++
	for i, part := range parts {
		if len(part) > 0 {
			if err := p.conns[g][i][k].mget(f.uniq, part); err != nil {
				return err
			}
		}
	}
	dim := p.dim
	for i, part := range parts {
		if len(part) == 0 {
			continue
		}
		if err := p.conns[g][i][k].readValues(len(part), func(j int) []byte {
			q := int(f.first[part[j]])
			return floatBytes(out[q*dim : (q+1)*dim])
		}); err != nil {
			return err
		}
	}
	f.spread(out, len(ids), dim)
	return nil
}

// respConn speaks just enough of the Redis protocol for MSET and MGET of binary values.
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
	for i, id := range ids {
		c.key(id)
		c.bulk(floatBytes(rows[i*dim : (i+1)*dim]))
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

// mget sends MGET of the ids uniq[part...] and flushes it; readValues reads the answer.
func (c *respConn) mget(uniq []uint64, part []int32) error {
	c.array(1 + len(part))
	c.bulk([]byte("MGET"))
	for _, u := range part {
		c.key(uniq[u])
	}
	return c.w.Flush()
}

// readValues reads an MGET answer of n values, value j into into(j) (which must have its length).
func (c *respConn) readValues(n int, into func(j int) []byte) error {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if v, ok := respInt(line, '*'); !ok || v != n {
		return fmt.Errorf("MGET answered %q", line)
	}
	for j := range n {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		dst := into(j)
		if v, ok := respInt(line, '$'); !ok || v != len(dst) {
			return fmt.Errorf("MGET value %q, want %d bytes", line, len(dst))
		}
		if _, err := io.ReadFull(c.r, dst); err != nil {
			return err
		}
		if _, err := c.r.Discard(2); err != nil {
			return err
		}
	}
	return nil
}

// respInt parses a RESP header line "<kind><digits>\r\n".
func respInt(line []byte, kind byte) (int, bool) {
	if len(line) < 4 || line[0] != kind || line[len(line)-2] != '\r' {
		return 0, false
	}
	v := 0
	for _, d := range line[1 : len(line)-2] {
		if d < '0' || d > '9' {
			return 0, false
		}
		v = v*10 + int(d-'0')
	}
	return v, true
}
