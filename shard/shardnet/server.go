package shardnet

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardwire"
)

// RPC methods of the protocol ('S' for shard in the high byte). Payloads are the shardwire
// encodings: AcquireRequest -> AcquireResponse, ReportRequest -> Status, LeaveRequest -> Status,
// ReportAcquireRequest -> AcquireResponse. A server without the last answers it with the RPC
// layer's unknown-method error, which the client turns into errors.ErrUnsupported.
const (
	methodAcquire       uint16 = 0x5301
	methodReport        uint16 = 0x5302
	methodLeave         uint16 = 0x5303
	methodReportAcquire uint16 = 0x5304
)

// codeBadRequest is the RPC error code of a request the server could not decode.
const codeBadRequest = rpc.MinAppCode + 1

// ServerStats are a server's counters since NewServer.
type ServerStats struct {
	Acquires       uint64 // Acquire calls served
	Reports        uint64 // Report calls served
	Leaves         uint64 // Leave calls served
	ReportAcquires uint64 // ReportAndAcquire calls served (including those answered Unsupported)
	Malformed      uint64 // requests refused because they could not be decoded
}

// Server serves a shard.Service (typically the coordinator's *shard.Dispatcher) to
// shardnet Clients over authenticated, multiplexed connections. All methods are safe for
// concurrent use.
type Server struct {
	svc shard.Service
	log *slog.Logger
	rpc *rpc.Server

	closed         atomic.Bool
	bufs           sync.Pool // *[]byte response scratch
	acquires       atomic.Uint64
	reports        atomic.Uint64
	leaves         atomic.Uint64
	reportAcquires atomic.Uint64
	malformed      atomic.Uint64
}

// NewServer returns a server for cfg.Service, or an error joining every problem of cfg. It
// serves nothing until Serve.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r, err := rpc.NewServer(rpc.ServerConfig{
		Secret: cfg.Secret, Logger: cfg.Logger, MaxConcurrent: cfg.MaxConcurrent,
		HandshakeTimeout: cfg.HandshakeTimeout, MaxFrameSize: maxFrame,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	s := &Server{svc: cfg.Service, log: cfg.Logger, rpc: r}
	handlers := map[uint16]rpc.Handler{
		methodAcquire: s.handleAcquire, methodReport: s.handleReport, methodLeave: s.handleLeave,
		methodReportAcquire: s.handleReportAcquire,
	}
	for m, h := range handlers {
		if err := r.Register(m, h); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Serve accepts connections on l and serves them until Close or Shutdown (it returns nil then)
// or until l fails (it returns the listener's error). It closes l before returning. Serve may
// run on several listeners at once.
func (s *Server) Serve(l net.Listener) error {
	err := s.rpc.Serve(l)
	if s.closed.Load() {
		return nil
	}
	return err
}

// Shutdown stops the server gracefully: it stops accepting and reading, tells every client
// which requests it read (later ones fail on their client with ErrUnavailable and are retried),
// finishes the calls in flight and closes the connections. If ctx ends first it returns ctx's
// error; Close then finishes the job.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closed.Store(true)
	return s.rpc.Shutdown(ctx)
}

// Close stops the server at once: listeners and connections close, calls in flight fail on
// their clients with ErrUnavailable. It waits for every goroutine of the server, Serve loops
// included. It is idempotent and returns nil.
func (s *Server) Close() error {
	s.closed.Store(true)
	return s.rpc.Close()
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{
		Acquires: s.acquires.Load(), Reports: s.reports.Load(), Leaves: s.leaves.Load(),
		ReportAcquires: s.reportAcquires.Load(), Malformed: s.malformed.Load(),
	}
}

// badRequest counts and logs an undecodable request and returns the error sent back.
func (s *Server) badRequest(method string, err error) error {
	s.malformed.Add(1)
	s.log.Warn("shardnet: malformed request", "method", method, "err", err)
	return &rpc.RemoteError{Code: codeBadRequest, Message: fmt.Sprintf("%s: %v", method, err)}
}

// scratch returns an empty pooled buffer to encode an answer into; putAnswer writes it to resp
// and pools it again.
func (s *Server) scratch() *[]byte {
	bp, _ := s.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	*bp = (*bp)[:0]
	return bp
}

func (s *Server) putAnswer(resp *rpc.Buffer, bp *[]byte) {
	_, _ = resp.Write(*bp)
	s.bufs.Put(bp)
}

func (s *Server) handleAcquire(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	r, rest, err := shardwire.DecodeAcquireRequest(req)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d trailing bytes", len(rest))
	}
	if err != nil {
		return s.badRequest("acquire", err)
	}
	s.acquires.Add(1)
	out := shardwire.NewAcquireResponse(s.svc.Acquire(ctx, r.Worker))
	bp := s.scratch()
	*bp = shardwire.AppendAcquireResponse(*bp, out)
	s.putAnswer(resp, bp)
	return nil
}

func (s *Server) handleReport(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	r, rest, err := shardwire.DecodeReportRequest(req)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d trailing bytes", len(rest))
	}
	if err != nil {
		return s.badRequest("report", err)
	}
	s.reports.Add(1)
	st := shardwire.NewStatus(s.svc.Report(ctx, r.Worker, r.Lease, r.Offset, r.Done))
	bp := s.scratch()
	*bp = shardwire.AppendStatus(*bp, st)
	s.putAnswer(resp, bp)
	return nil
}

// handleReportAcquire serves the combined call; a Service without it is answered Unsupported.
func (s *Server) handleReportAcquire(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	r, rest, err := shardwire.DecodeReportAcquireRequest(req)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d trailing bytes", len(rest))
	}
	if err != nil {
		return s.badRequest("report and acquire", err)
	}
	s.reportAcquires.Add(1)
	out := shardwire.NewAcquireResponse(shard.ReportAndAcquire(ctx, s.svc, r.Worker, r.Lease, r.Offset))
	bp := s.scratch()
	*bp = shardwire.AppendAcquireResponse(*bp, out)
	s.putAnswer(resp, bp)
	return nil
}

func (s *Server) handleLeave(ctx context.Context, req []byte, resp *rpc.Buffer) error {
	r, rest, err := shardwire.DecodeLeaveRequest(req)
	if err == nil && len(rest) != 0 {
		err = fmt.Errorf("%d trailing bytes", len(rest))
	}
	if err != nil {
		return s.badRequest("leave", err)
	}
	s.leaves.Add(1)
	st := shardwire.NewStatus(s.svc.Leave(ctx, r.Worker))
	bp := s.scratch()
	*bp = shardwire.AppendStatus(*bp, st)
	s.putAnswer(resp, bp)
	return nil
}

// Register adds a handler for method to the server's RPC server, so that other protocols of
// this module (the coordinator's control calls of package elastic) share the dispatcher's one
// authenticated port. A call that arrives before its handler is registered gets an
// unknown-method error. Methods 0x5300-0x53ff are the dispatcher's own.
func (s *Server) Register(method uint16, h rpc.Handler) error {
	if method>>8 == 0x53 {
		return fmt.Errorf("%w: method %#x is reserved", ErrInvalidConfig, method)
	}
	return s.rpc.Register(method, h)
}
