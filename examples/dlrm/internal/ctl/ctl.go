// Package ctl is the control channel between the processes of a multi-process DLRM job (the
// coordinator, parameter servers and workers): Go's net/rpc over TCP connections that both ends
// authenticate with the cluster secret before any call (an HMAC-SHA256 challenge in each
// direction; the secret never crosses the wire, and nothing is encrypted). It carries the
// checkpoint barrier and the checkpoint and restore commands, which the library's public API
// does not offer over the network yet.
//
// A Server and a Client are safe for concurrent use; Close is idempotent and joins every
// goroutine the Server started.
package ctl

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"sync"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
)

// ErrAuth is returned when the peer does not prove it knows the cluster secret.
var ErrAuth = errors.New("ctl: authentication failed")

const (
	nonceLen         = 32
	handshakeTimeout = 5 * time.Second
)

func mac(secret []byte, label string, a, b []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	h.Write(a)
	h.Write(b)
	return h.Sum(nil)
}

// serverHandshake: send a nonce, check the client's proof, prove ourselves.
func serverHandshake(c net.Conn, secret []byte) error {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.SetDeadline(time.Time{})
	sn := make([]byte, nonceLen)
	rand.Read(sn)
	if _, err := c.Write(sn); err != nil {
		return err
	}
	in := make([]byte, nonceLen+sha256.Size)
	if _, err := io.ReadFull(c, in); err != nil {
		return err
	}
	cn := in[:nonceLen]
	if !hmac.Equal(in[nonceLen:], mac(secret, "elasticps-ctl-client", sn, cn)) {
		return ErrAuth
	}
	_, err := c.Write(mac(secret, "elasticps-ctl-server", sn, cn))
	return err
}

func clientHandshake(c net.Conn, secret []byte) error {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.SetDeadline(time.Time{})
	sn := make([]byte, nonceLen)
	if _, err := io.ReadFull(c, sn); err != nil {
		return err
	}
	cn := make([]byte, nonceLen)
	rand.Read(cn)
	if _, err := c.Write(append(cn, mac(secret, "elasticps-ctl-client", sn, cn)...)); err != nil {
		return err
	}
	proof := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, proof); err != nil {
		return err
	}
	if !hmac.Equal(proof, mac(secret, "elasticps-ctl-server", sn, cn)) {
		return ErrAuth
	}
	return nil
}

// Server serves registered receivers to authenticated clients.
type Server struct {
	secret []byte
	rpc    *rpc.Server
	mu     sync.Mutex
	ls     []net.Listener
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a server whose methods are those of rcvr, registered under name (see
// net/rpc for the method shapes).
func NewServer(secret []byte, name string, rcvr any) (*Server, error) {
	s := &Server{secret: secret, rpc: rpc.NewServer(), conns: map[net.Conn]bool{}}
	if err := s.rpc.RegisterName(name, rcvr); err != nil {
		return nil, err
	}
	return s, nil
}

// Serve accepts connections on l until Close.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return nil
	}
	s.ls = append(s.ls, l)
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			return err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			if serverHandshake(c, s.secret) != nil {
				return
			}
			s.rpc.ServeConn(c)
		}()
	}
}

// Close stops accepting, closes every connection and waits for their goroutines. Calls being
// served are abandoned.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, l := range s.ls {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// Client calls a Server.
type Client struct {
	addr   string
	secret []byte
	mu     sync.Mutex
	c      *rpc.Client
}

// NewClient returns a client of the server at addr; it connects on the first call.
func NewClient(addr string, secret []byte) *Client { return &Client{addr: addr, secret: secret} }

func (c *Client) conn(ctx context.Context) (*rpc.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		return c.c, nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, err
	}
	if err := clientHandshake(conn, c.secret); err != nil {
		conn.Close()
		return nil, fmt.Errorf("ctl %s: %w", c.addr, err)
	}
	c.c = rpc.NewClient(conn)
	return c.c, nil
}

// Call calls method with args and fills reply, honouring ctx. A call whose connection failed
// drops the connection so that the next call redials.
func (c *Client) Call(ctx context.Context, method string, args, reply any) error {
	rc, err := c.conn(ctx)
	if err != nil {
		return err
	}
	call := rc.Go(method, args, reply, make(chan *rpc.Call, 1))
	select {
	case <-call.Done:
		if errors.Is(call.Error, rpc.ErrShutdown) || errors.Is(call.Error, io.ErrUnexpectedEOF) {
			c.mu.Lock()
			if c.c == rc {
				c.c.Close()
				c.c = nil
			}
			c.mu.Unlock()
		}
		return call.Error
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		c.c.Close()
		c.c = nil
	}
	return nil
}

// Messages of the coordinator's service ("Coord").

// Barrier is a worker's long poll for the checkpoint barrier: it returns when the coordinator's
// generation differs from Gen or after a while.
type Barrier struct {
	Worker string
	Gen    uint64
}

// BarrierReply tells a worker to pause (close its gate and call Arrived), to stop, or to
// register again (Rejoin: the coordinator does not count it at barriers, because it never
// joined or fell silent for too long; it must keep its gate closed until Join answers).
type BarrierReply struct {
	Gen    uint64
	Pause  bool
	Stop   bool
	Rejoin bool
}

// Failure tells the coordinator that a worker failed while applying a batch.
type Failure struct {
	Worker string
	Err    string
}

// Messages of a parameter server's service ("PS").

// Step names a checkpoint step.
type Step struct{ Step uint64 }

// SnapshotArgs asks for a snapshot at Step. Final is the job's last checkpoint: a server whose
// generations are still being persisted waits for them rather than answering Busy.
type SnapshotArgs struct {
	Step  uint64
	Final bool
}

// SnapshotReply reports a server's snapshot. Busy means it was not taken because both
// generations were still being persisted (nothing was copied).
type SnapshotReply struct {
	Bytes   int64
	Full    bool
	Busy    bool
	Blocked time.Duration
}

// ManifestReply carries a persisted manifest for the commit.
type ManifestReply struct{ Ref checkpoint.ManifestRef }

// LoadReply reports a server's restore.
type LoadReply struct {
	Records int64
	Dense   int
	Sources string
}

// Empty is an empty message.
type Empty struct{}
