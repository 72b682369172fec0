package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/wrapperspb"

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

// bytesFloats returns b as float32s without a copy when b is aligned, else a copy.
func bytesFloats(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	if uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
	}
	v := make([]float32, len(b)/4)
	copy(floatBytes(v), b)
	return v
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

// ---- gRPC ----

// grpcVersion is the grpc-go release the peer runs.
const grpcVersion = grpc.Version

// The peer's tuning, as users of grpc-go tune a service that moves large messages: flow-control
// windows larger than a batch's answer (which also turns off the bandwidth-delay estimation that
// would otherwise grow them step by step), larger read and write buffers, and message size limits
// above the largest batch.
const (
	grpcWindow  = 16 << 20
	grpcBuffer  = 256 << 10
	grpcMaxSize = 256 << 20
)

const (
	grpcPullMethod = "/elasticps.bench.PS/Pull"
	grpcPushMethod = "/elasticps.bench.PS/Push"
)

// grpcTableServer is what the gRPC service's methods are called on.
type grpcTableServer interface {
	pull(ids []byte) (*wrapperspb.BytesValue, error)
	push(req []byte) (*wrapperspb.BytesValue, error)
}

// grpcServiceDesc describes the service PS with two unary methods, both taking and returning
// google.protobuf.BytesValue: Pull (ids, little-endian uint64s -> rows, little-endian float32s)
// and Push (step uint64, ids, gradients -> empty). Written by hand, as code generation would.
func grpcServiceDesc() *grpc.ServiceDesc {
	method := func(name string, call func(s grpcTableServer, b []byte) (*wrapperspb.BytesValue, error)) grpc.MethodDesc {
		return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, icp grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			if icp == nil {
				return call(srv.(grpcTableServer), in.Value)
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/elasticps.bench.PS/" + name}
			return icp(ctx, in, info, func(ctx context.Context, req any) (any, error) {
				return call(srv.(grpcTableServer), req.(*wrapperspb.BytesValue).Value)
			})
		}}
	}
	return &grpc.ServiceDesc{
		ServiceName: "elasticps.bench.PS",
		HandlerType: (*grpcTableServer)(nil),
		Methods: []grpc.MethodDesc{
			method("Pull", grpcTableServer.pull),
			method("Push", grpcTableServer.push),
		},
		Metadata: "bench",
	}
}

// grpcTable serves one server's embedding table over gRPC.
type grpcTable struct {
	tab *embedding.Table
	dim int
}

func (s *grpcTable) pull(b []byte) (*wrapperspb.BytesValue, error) {
	ids := make([]uint64, len(b)/8)
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	rows := make([]float32, len(ids)*s.dim)
	if err := s.tab.Lookup(ids, rows); err != nil {
		return nil, err
	}
	return &wrapperspb.BytesValue{Value: floatBytes(rows)}, nil
}

func (s *grpcTable) push(b []byte) (*wrapperspb.BytesValue, error) {
	if len(b) < 8 || (len(b)-8)%(8+4*s.dim) != 0 {
		return nil, fmt.Errorf("push of %d bytes", len(b))
	}
	step := binary.LittleEndian.Uint64(b)
	n := (len(b) - 8) / (8 + 4*s.dim)
	ids := make([]uint64, n)
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint64(b[8+8*i:])
	}
	if err := s.tab.Apply(ids, bytesFloats(b[8+8*n:]), uint32(step)); err != nil {
		return nil, err
	}
	return &wrapperspb.BytesValue{}, nil
}

// grpcPeer is one gRPC server per ps server over the same table, and a client per goroutine.
type grpcPeer struct {
	srvs    []*grpc.Server
	wg      sync.WaitGroup
	clients []*grpcClient
	suite   string // the TLS cipher suite the connections negotiated; "" when insecure
	once    sync.Once
}

// grpcTLS returns the credentials of a server with a self-signed ECDSA P-256 certificate for
// 127.0.0.1, made in this process, and of clients that trust it: TLS as grpc-go sets it up by
// default (TLS 1.3, the cipher suite Go prefers on this hardware).
func grpcTLS() (server, client credentials.TransportCredentials, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "elasticps bench"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	server = credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}}})
	client = credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
	return server, client, nil
}

// startGRPC starts one gRPC server per server of cl over its table and a client per goroutine,
// in plaintext (insecure credentials, as the peer runs by default) or with TLS.
func startGRPC(cl *psCluster, goroutines, dim int, withTLS bool) (*grpcPeer, error) {
	p := &grpcPeer{}
	srvCreds, cliCreds := insecure.NewCredentials(), insecure.NewCredentials()
	if withTLS {
		var err error
		if srvCreds, cliCreds, err = grpcTLS(); err != nil {
			return nil, err
		}
	}
	var addrs []string
	for _, s := range cl.srvs {
		tab, ok := s.Table("emb")
		if !ok {
			p.stop()
			return nil, errors.New("server has no table emb")
		}
		srv := grpc.NewServer(grpc.Creds(srvCreds), grpc.InitialWindowSize(grpcWindow), grpc.InitialConnWindowSize(grpcWindow),
			grpc.ReadBufferSize(grpcBuffer), grpc.WriteBufferSize(grpcBuffer),
			grpc.MaxRecvMsgSize(grpcMaxSize), grpc.MaxSendMsgSize(grpcMaxSize))
		srv.RegisterService(grpcServiceDesc(), &grpcTable{tab: tab, dim: dim})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			p.stop()
			return nil, err
		}
		p.srvs = append(p.srvs, srv)
		p.wg.Add(1)
		go func() { defer p.wg.Done(); srv.Serve(l) }()
		addrs = append(addrs, l.Addr().String())
	}
	for range goroutines {
		c := &grpcClient{owner: cl.owner, dim: dim, f: newFolder(4096, dim), parts: make([][]int32, len(addrs)), bufs: make([][]byte, len(addrs))}
		for _, addr := range addrs {
			var conns []*grpc.ClientConn
			for range psConns {
				cc, err := grpc.NewClient("passthrough:///"+addr,
					grpc.WithTransportCredentials(cliCreds),
					grpc.WithInitialWindowSize(grpcWindow), grpc.WithInitialConnWindowSize(grpcWindow),
					grpc.WithReadBufferSize(grpcBuffer), grpc.WithWriteBufferSize(grpcBuffer),
					grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(grpcMaxSize), grpc.MaxCallSendMsgSize(grpcMaxSize)))
				if err != nil {
					p.stop()
					return nil, err
				}
				conns = append(conns, cc)
			}
			c.conns = append(c.conns, conns)
		}
		p.clients = append(p.clients, c)
	}
	if withTLS {
		// One call names the suite the connections agree on, for the report.
		var from peer.Peer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := p.clients[0]
		err := c.conns[0][0].Invoke(ctx, grpcPullMethod, &wrapperspb.BytesValue{}, new(wrapperspb.BytesValue), grpc.Peer(&from))
		if err != nil {
			p.stop()
			return nil, fmt.Errorf("grpc over TLS: %w", err)
		}
		if info, ok := from.AuthInfo.(credentials.TLSInfo); ok {
			p.suite = tls.VersionName(info.State.Version) + " " + tls.CipherSuiteName(info.State.CipherSuite)
		}
	}
	return p, nil
}

func (p *grpcPeer) stop() {
	p.once.Do(func() {
		for _, c := range p.clients {
			for _, conns := range c.conns {
				for _, cc := range conns {
					cc.Close()
				}
			}
		}
		for _, s := range p.srvs {
			s.Stop()
		}
		p.wg.Wait()
	})
}

// grpcClient is one goroutine's client: psConns connections to each server, taken in turn.
type grpcClient struct {
	conns [][]*grpc.ClientConn // [server][k]
	calls int
	owner func(uint64) int
	dim   int
	f     *folder
	parts [][]int32
	bufs  [][]byte
}

// each runs fn for every server with a part, the last in this goroutine and the others in their
// own, and returns the first error.
func (c *grpcClient) each(fn func(i int, part []int32) error) error {
	last := -1
	for i, part := range c.parts {
		if len(part) > 0 {
			last = i
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(c.parts)+1)
	for i, part := range c.parts {
		if len(part) == 0 || i == last {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn(i, part) }()
	}
	if last >= 0 {
		errs[len(c.parts)] = fn(last, c.parts[last])
	}
	wg.Wait()
	return errors.Join(errs...)
}

// pull asks every server for its part of the batch's distinct ids at once and copies each row to
// every position of its id.
func (c *grpcClient) pull(ctx context.Context, ids []uint64, out []float32) error {
	f, dim := c.f, c.dim
	f.fold(ids)
	split(c.parts, f, c.owner)
	k := c.calls % psConns
	c.calls++
	err := c.each(func(i int, part []int32) error {
		req := c.bufs[i][:0]
		for _, u := range part {
			req = binary.LittleEndian.AppendUint64(req, f.uniq[u])
		}
		c.bufs[i] = req
		resp := new(wrapperspb.BytesValue)
		if err := c.conns[i][k].Invoke(ctx, grpcPullMethod, &wrapperspb.BytesValue{Value: req}, resp); err != nil {
			return err
		}
		rb := 4 * dim
		if len(resp.Value) != rb*len(part) {
			return fmt.Errorf("grpc pull answered %d bytes for %d rows", len(resp.Value), len(part))
		}
		for j, u := range part {
			q := int(f.first[u])
			copy(floatBytes(out[q*dim:(q+1)*dim]), resp.Value[rb*j:rb*(j+1)])
		}
		return nil
	})
	if err != nil {
		return err
	}
	f.spread(out, len(ids), dim)
	return nil
}

// push sums the gradients of repeated ids and sends every server its part at once.
func (c *grpcClient) push(ctx context.Context, ids []uint64, grads []float32, step uint64) error {
	f, dim := c.f, c.dim
	f.fold(ids)
	sum := f.sumGrads(grads, len(ids), dim)
	split(c.parts, f, c.owner)
	k := c.calls % psConns
	c.calls++
	return c.each(func(i int, part []int32) error {
		req := binary.LittleEndian.AppendUint64(c.bufs[i][:0], step)
		for _, u := range part {
			req = binary.LittleEndian.AppendUint64(req, f.uniq[u])
		}
		for _, u := range part {
			req = append(req, floatBytes(sum[int(u)*dim:int(u+1)*dim])...)
		}
		c.bufs[i] = req
		return c.conns[i][k].Invoke(ctx, grpcPushMethod, &wrapperspb.BytesValue{Value: req}, new(wrapperspb.BytesValue))
	})
}
