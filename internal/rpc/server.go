package rpc

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/internal/wire"
)

// Handler serves one call. req is the request payload; it belongs to the
// server and is valid only until the handler returns (copy what you keep).
// The handler writes its response into resp and returns nil, or returns an
// error: a *RemoteError (or an error wrapping one) reaches the caller as is,
// anything else as a RemoteError with Code CodeInternal. On error resp is
// discarded. ctx is cancelled when the connection breaks or the server is
// closed; a handler should return promptly then. Handlers run concurrently,
// also for the same connection.
type Handler func(ctx context.Context, req []byte, resp *Buffer) error

// Server serves calls on any number of listeners. Register handlers, then
// Serve. All methods are safe for concurrent use.
type Server struct {
	cfg              common
	handshakeTimeout time.Duration
	maxInFlight      int
	tls              *tls.Config // nil: no TLS of our own
	gate             *gate       // connections not yet authenticated
	plog             *rateLog    // warnings a peer can cause, rate-limited
	pool             wire.Pool
	sem              chan struct{} // one slot per running handler
	jobs             chan job      // to idle workers; unbuffered
	bufs             sync.Pool     // of *Buffer

	hmu      sync.Mutex // serialises Register
	handlers atomic.Pointer[map[uint16]Handler]

	ctx    context.Context // parent of handler contexts; cancelled by Close
	cancel context.CancelFunc
	stats  counters

	mu        sync.Mutex
	state     atomic.Int32  // stateRunning, stateShutdown or stateClosed; written under mu
	stopping  chan struct{} // closed when Shutdown or Close starts
	drained   chan struct{} // closed when stopping and active == 0
	active    int           // running Serve loops and connection goroutines
	listeners map[net.Listener]struct{}
	conns     map[*serverConn]struct{}
}

const (
	stateRunning int32 = iota
	stateShutdown
	stateClosed
)

// NewServer returns a server with no handlers.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:              newCommon(cfg.Secret, cfg.Protection, cfg.Logger, cfg.MaxFrameSize, cfg.Compression, cfg.CompressThreshold, cfg.WriteTimeout),
		handshakeTimeout: cfg.HandshakeTimeout,
		maxInFlight:      cmp.Or(cfg.MaxConnInFlight, DefaultMaxConnInFlight),
		tls:              tls13(cfg.TLS),
		stopping:         make(chan struct{}),
		drained:          make(chan struct{}),
		listeners:        make(map[net.Listener]struct{}),
		conns:            make(map[*serverConn]struct{}),
	}
	if s.handshakeTimeout == 0 {
		s.handshakeTimeout = DefaultHandshakeTimeout
	}
	maxHS := cmp.Or(cfg.MaxHandshakes, DefaultMaxHandshakes)
	s.gate = newGate(maxHS, min(cmp.Or(cfg.MaxHandshakesPerHost, DefaultMaxHandshakesHost), maxHS))
	s.plog = newRateLog(s.cfg.log, peerLogBurst, peerLogInterval, time.Now)
	n := cfg.MaxConcurrent
	if n == 0 {
		n = DefaultMaxConcurrent
	}
	s.sem = make(chan struct{}, n)
	s.jobs = make(chan job)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	empty := map[uint16]Handler{}
	s.handlers.Store(&empty)
	return s, nil
}

// Register installs h for method. It fails if h is nil or method already has
// a handler. Handlers may be registered while serving; a call that arrives
// before its handler gets a CodeUnknownMethod error.
func (s *Server) Register(method uint16, h Handler) error {
	if h == nil {
		return fmt.Errorf("rpc: register method %d: nil handler", method)
	}
	s.hmu.Lock()
	defer s.hmu.Unlock()
	old := *s.handlers.Load()
	if _, ok := old[method]; ok {
		return fmt.Errorf("rpc: register method %d: already registered", method)
	}
	next := make(map[uint16]Handler, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[method] = h
	s.handlers.Store(&next)
	return nil
}

// Stats returns the server's security counters.
func (s *Server) Stats() Stats { return s.stats.load() }

// Serve accepts connections on l and serves them until l fails or the server
// shuts down; it closes l before returning. It returns ErrClosed after
// Shutdown or Close, otherwise the listener's error. Serve may run on
// several listeners at once.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.state.Load() != stateRunning {
		s.mu.Unlock()
		_ = l.Close()
		return ErrClosed
	}
	s.listeners[l] = struct{}{}
	s.active++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		_ = l.Close()
		s.done()
	}()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			select {
			case <-s.stopping:
				return ErrClosed
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("rpc: serve %s: %w", l.Addr(), err)
			}
			// Resource exhaustion (too many open files, ...) passes: wait
			// a little and accept again.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.cfg.log.Warn("rpc: accept failed", "addr", l.Addr().String(), "err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.stopping:
				t.Stop()
				return ErrClosed
			}
			continue
		}
		backoff = 0
		host := SourceHost(nc.RemoteAddr())
		if ok, perHost := s.gate.enter(host); !ok {
			s.stats.refusedConns.Add(1)
			limit := "MaxHandshakes"
			if perHost {
				limit = "MaxHandshakesPerHost"
			}
			s.plog.Warn("rpc: connection refused: too many connections authenticating", "remote", nc.RemoteAddr().String(), "limit", limit)
			_ = closeConn(nc)
			continue
		}
		if s.tls != nil {
			nc = tls.Server(nc, s.tls)
		}
		sc := &serverConn{s: s, nc: nc, host: host}
		sc.inflight.limit = s.maxInFlight
		s.mu.Lock()
		if s.state.Load() != stateRunning {
			s.mu.Unlock()
			s.gate.leave(host)
			_ = closeConn(nc)
			return ErrClosed
		}
		s.conns[sc] = struct{}{}
		s.active++
		s.mu.Unlock()
		go sc.serve()
	}
}

// Shutdown stops the server gracefully: it closes the listeners, stops
// reading requests, tells every client which requests it read (those after
// are failed on the client with ErrUnavailable, safe to retry), waits for
// the handlers in flight to finish and their responses to be written, and
// closes the connections. If ctx ends first it returns ctx.Err() and leaves
// the rest to finish, or to Close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.state.Load() == stateRunning {
		s.state.Store(stateShutdown)
		s.stopLocked()
		for sc := range s.conns {
			sc.stopReading()
		}
	}
	s.mu.Unlock()
	select {
	case <-s.drained:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the server at once: listeners and connections are closed,
// handler contexts cancelled, calls in flight fail on their clients with
// ErrConnClosed. It waits for every goroutine of the server to finish,
// including running handlers (which should honour their context). It is
// idempotent and always returns nil.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.state.Load() == stateRunning {
		s.stopLocked()
	}
	if s.state.Load() != stateClosed {
		s.state.Store(stateClosed)
		// Connections first: a handler that returns once cancelled must
		// find its connection gone, not answer as if it had finished.
		for sc := range s.conns {
			_ = closeConn(sc.nc)
		}
		s.cancel()
	}
	s.mu.Unlock()
	<-s.drained
	return nil
}

// stopLocked closes the stopping channel (before any read is interrupted,
// see serverConn.serve) and the listeners.
func (s *Server) stopLocked() {
	close(s.stopping)
	for l := range s.listeners {
		_ = l.Close()
	}
	if s.active == 0 {
		close(s.drained)
	}
}

// done records the end of a Serve loop or connection goroutine.
func (s *Server) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if s.active == 0 && s.state.Load() != stateRunning {
		close(s.drained)
	}
}

// serverConn is one accepted connection. Its goroutine reads requests and
// starts a goroutine per request; writes are serialised by w.
type serverConn struct {
	s        *Server
	nc       net.Conn
	host     string // the source host, for the handshake limits
	w        *frameWriter
	sess     session
	inflight inflight // bytes held for this connection

	handlers sync.WaitGroup
	lastID   uint64 // the last request id dispatched; owned by the reading goroutine
}

// stopReading interrupts the reader for a graceful shutdown. s.stopping is
// already closed.
func (sc *serverConn) stopReading() { _ = sc.nc.SetReadDeadline(time.Unix(1, 0)) }

func (sc *serverConn) serve() {
	s := sc.s
	log := s.cfg.log.With("remote", sc.nc.RemoteAddr().String())
	defer func() {
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
		s.done()
	}()
	sess, err := serverHandshake(sc.nc, &s.cfg, s.handshakeTimeout)
	s.gate.leave(sc.host)
	if err != nil {
		select {
		case <-s.stopping:
			log.Debug("rpc: connection closed during handshake by shutdown", "err", err)
		default:
			if errors.Is(err, ErrAuth) {
				s.stats.authFailures.Add(1)
			} else {
				s.stats.failedHandshakes.Add(1)
			}
			s.plog.Warn("rpc: connection refused", "remote", sc.nc.RemoteAddr().String(), "reason", err.Error())
		}
		_ = closeConn(sc.nc)
		return
	}
	sc.sess = sess
	sc.w = newFrameWriter(sc.nc, s.cfg.writeTimeout, sess.send, &s.pool, func(error) { _ = closeConn(sc.nc) })
	sc.w.release = sc.inflight.sub
	defer sc.w.stop()
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	rd := wire.NewReader(sc.nc, wire.ReaderOptions{Pool: &s.pool, MaxFrameSize: s.cfg.maxFrame, Decompress: sess.compress, Protector: sess.recv})
	graceful, reason := sc.readLoop(ctx, rd)
	if graceful {
		// Tell the client which requests were read, let the handlers
		// finish and write their answers, then close.
		_ = sc.w.send(nil, wire.Header{Kind: wire.KindGoAway, ID: sc.lastID}, nil, nil, 0)
		sc.handlers.Wait()
		_ = closeConn(sc.nc)
		log.Debug("rpc: connection closed by shutdown")
		return
	}
	_ = closeConn(sc.nc)
	cancel()
	sc.handlers.Wait()
	if reason != nil {
		s.plog.Warn("rpc: connection closed", "remote", sc.nc.RemoteAddr().String(), "reason", reason.Error())
	}
}

// readLoop reads and dispatches requests until the connection fails or the
// server shuts down. It reports whether it stopped for a graceful shutdown,
// and the reason worth logging if the peer broke the protocol.
func (sc *serverConn) readLoop(ctx context.Context, rd *wire.Reader) (graceful bool, reason error) {
	s := sc.s
	for {
		// The stopping channel is closed before read deadlines are set, so
		// either this check sees it or the read below is interrupted.
		select {
		case <-s.stopping:
			return s.state.Load() != stateClosed, nil
		default:
		}
		if full := sc.inflight.full(); full != nil {
			s.stats.throttledReads.Add(1)
			select {
			case <-full:
			case <-s.stopping:
				return s.state.Load() != stateClosed, nil
			}
		}
		f, err := rd.ReadFrame()
		if err != nil {
			select {
			case <-s.stopping:
				if errors.Is(err, os.ErrDeadlineExceeded) {
					return true, nil
				}
				return false, nil
			default:
			}
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return false, nil
			}
			if errors.Is(err, wire.ErrIntegrity) {
				s.stats.forgedFrames.Add(1)
				return false, err
			}
			if errors.Is(err, wire.ErrTruncated) || errors.Is(err, wire.ErrTooLarge) || errors.Is(err, wire.ErrMalformed) {
				return false, err
			}
			return false, fmt.Errorf("read: %w", err)
		}
		if f.Kind != wire.KindRequest {
			s.pool.Put(f.Payload)
			return false, fmt.Errorf("%w: unexpected %s frame from a client", wire.ErrMalformed, f.Kind)
		}
		select {
		case s.sem <- struct{}{}:
		case <-s.stopping:
			s.pool.Put(f.Payload)
			return s.state.Load() != stateClosed, nil
		}
		sc.lastID = f.ID
		sc.inflight.add(len(f.Payload))
		sc.handlers.Add(1)
		s.dispatch(job{sc: sc, ctx: ctx, f: f})
	}
}

func (sc *serverConn) handle(ctx context.Context, f wire.Frame) {
	s := sc.s
	defer func() {
		<-s.sem
		sc.handlers.Done()
	}()
	resp, _ := s.bufs.Get().(*Buffer)
	if resp == nil {
		resp = &Buffer{pool: &s.pool}
	}
	defer func() {
		resp.release()
		s.bufs.Put(resp)
	}()
	err := sc.invoke(ctx, f.Method, f.Payload, resp)
	reqBytes := len(f.Payload)
	s.pool.Put(f.Payload)

	h := wire.Header{Kind: wire.KindResponse, ID: f.ID}
	payload := resp.Bytes()
	if err == nil && len(payload) > sc.sess.peerMax {
		err = &RemoteError{Code: CodeTooLarge, Message: fmt.Sprintf("response of %d bytes exceeds the client's limit of %d", len(payload), sc.sess.peerMax)}
	}
	if err != nil {
		var re *RemoteError
		if !errors.As(err, &re) {
			re = &RemoteError{Code: CodeInternal, Message: err.Error()}
		}
		h.Kind = wire.KindError
		payload = wire.AppendError(nil, re.Code, re.Message, re.Data)
		if len(payload) > sc.sess.peerMax {
			payload = wire.AppendError(nil, re.Code, "error too large for the client", nil)
		}
	} else if sc.sess.compress && len(payload) >= s.cfg.compressThreshold {
		if c, ok := wire.Compress(&s.pool, payload); ok {
			defer s.pool.Put(c)
			h.Flags, payload = wire.FlagCompressed, c
		}
	}
	// The response is held until written; the request is gone. A failed
	// write closes the connection; the reader then tears it down.
	charge := wire.HeaderSize + len(payload)
	sc.inflight.add(charge)
	sc.inflight.sub(reqBytes)
	_ = sc.w.send(nil, h, payload, nil, charge)
}

// job is one request for a worker.
type job struct {
	sc  *serverConn
	ctx context.Context
	f   wire.Frame
}

// dispatch hands j to an idle worker, or starts one. Workers outlive their
// job and wait for the next, so that steady traffic neither starts
// goroutines nor grows fresh stacks; at most MaxConcurrent exist, as each
// runs one job at a time under s.sem, and idle ones exit when the server
// stops.
func (s *Server) dispatch(j job) {
	select {
	case s.jobs <- j:
		return
	default:
	}
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
	go s.worker(j)
}

func (s *Server) worker(j job) {
	defer s.done()
	for {
		j.sc.handle(j.ctx, j.f)
		j = job{}
		select {
		case j = <-s.jobs:
		case <-s.stopping:
			return
		}
	}
}

// invoke runs the handler for method, turning a panic into an error.
func (sc *serverConn) invoke(ctx context.Context, method uint16, req []byte, resp *Buffer) (err error) {
	h := (*sc.s.handlers.Load())[method]
	if h == nil {
		return &RemoteError{Code: CodeUnknownMethod, Message: fmt.Sprintf("unknown method %d", method)}
	}
	defer func() {
		if r := recover(); r != nil {
			sc.s.cfg.log.Error("rpc: handler panicked", "method", method, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = &RemoteError{Code: CodeInternal, Message: fmt.Sprintf("handler for method %d panicked", method)}
		}
	}()
	return h(ctx, req, resp)
}
