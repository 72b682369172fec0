package remote

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/server"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/internal/transport"
	"github.com/elasticps/elasticps/internal/wait"
	"github.com/elasticps/elasticps/ps"
)

// The control protocol runs on each process's one RPC server ('E' in the high byte of the
// method): a parameter server's process serves the server agent (ServeServer), the
// coordinator's process serves the control calls (ServeControl). An id is never reused.
const (
	methodInstall  uint16 = 0x4501
	methodFence    uint16 = 0x4502
	methodSnapshot uint16 = 0x4503
	methodPersist  uint16 = 0x4504
	methodVerify   uint16 = 0x4505
	methodLoad     uint16 = 0x4506
	methodHealth   uint16 = 0x4507
	methodRestore  uint16 = 0x4508
	methodLead     uint16 = 0x4509
	methodTable    uint16 = 0x450a
	methodDigest   uint16 = 0x450b

	methodJoin  uint16 = 0x4511
	methodBegin uint16 = 0x4512
	methodEnd   uint16 = 0x4513
	methodLeave uint16 = 0x4514

	methodSuspect uint16 = 0x4515

	methodStatus         uint16 = 0x4521
	methodSetParallelism uint16 = 0x4522
	methodSetPlan        uint16 = 0x4523
	methodAddServers     uint16 = 0x4524
	methodRemoveServers  uint16 = 0x4525
	methodRebalance      uint16 = 0x4526
	methodUsage          uint16 = 0x4527
	methodFail           uint16 = 0x4528
)

// beginHold bounds how long the coordinator holds one remote Begin; the worker calls again.
const beginHold = 5 * time.Second

// Registrar is a process's RPC server as the control protocol registers on it: *ps.Server and
// *shardnet.Server.
type Registrar interface {
	Register(method uint16, h rpc.Handler) error
}

func register(reg Registrar, hs map[uint16]rpc.Handler) error {
	for m, h := range hs {
		if err := reg.Register(m, h); err != nil {
			return fmt.Errorf("remote: register method %#x: %w", m, err)
		}
	}
	return nil
}

// ServeServer registers the server agent of l on reg (the server's own *ps.Server): the
// coordinator's Server drives it from another process.
func ServeServer(reg Registrar, srv *server.Server) error {
	table := func(b []byte) (*ps.OwnerTable, error) {
		t, rest, err := ps.DecodeOwnerTable(b)
		if err != nil || len(rest) != 0 {
			return nil, errMalformed
		}
		return t, nil
	}
	// read serves the calls any coordinator may make (Health, Table, Lead); handle those of
	// the coordinator that leads the server.
	read := func(f func(ctx context.Context, m serverMsg, resp *rpc.Buffer) error) rpc.Handler {
		return func(ctx context.Context, req []byte, resp *rpc.Buffer) error {
			m, err := decodeServerMsg(req)
			if err != nil {
				return remoteErr(err)
			}
			if m.inc != 0 && m.inc != srv.Incarnation() {
				return remoteErr(fmt.Errorf("%w: server %s is incarnation %x, the call is for %x", elastic.ErrReplaced, srv.Node().ID, srv.Incarnation(), m.inc))
			}
			return remoteErr(f(ctx, m, resp))
		}
	}
	handle := func(f func(ctx context.Context, m serverMsg, resp *rpc.Buffer) error) rpc.Handler {
		return read(func(ctx context.Context, m serverMsg, resp *rpc.Buffer) error {
			if err := srv.Obeys(m.coord); err != nil {
				return err
			}
			return f(ctx, m, resp)
		})
	}
	return register(reg, map[uint16]rpc.Handler{
		methodHealth: read(func(ctx context.Context, _ serverMsg, resp *rpc.Buffer) error {
			h, err := srv.Health(ctx)
			if err == nil {
				e := enc(nil).u64(h.Incarnation).u64(h.TableVersion).u64(h.Leader).u64(h.Snapshot)
				if h.Restoring != 0 { // only then: a coordinator of the previous release reads four
					e = e.u64(h.Restoring)
				}
				resp.Write(e)
			}
			return err
		}),
		methodLead: read(func(ctx context.Context, m serverMsg, _ *rpc.Buffer) error {
			return srv.Lead(ctx, m.coord)
		}),
		methodTable: read(func(ctx context.Context, _ serverMsg, resp *rpc.Buffer) error {
			t, err := srv.Table(ctx)
			if err == nil && t != nil {
				resp.Write(ps.AppendOwnerTable(nil, t))
			}
			return err
		}),
		methodRestore: handle(func(ctx context.Context, m serverMsg, _ *rpc.Buffer) error {
			t, err := table(m.table)
			if err != nil {
				return err
			}
			return srv.Restore(ctx, m.step, t, elastic.RestoreMode(m.mode))
		}),
		methodInstall: handle(func(ctx context.Context, m serverMsg, _ *rpc.Buffer) error {
			t, err := table(m.table)
			if err != nil {
				return err
			}
			return srv.InstallTable(ctx, t)
		}),
		methodFence: handle(func(ctx context.Context, m serverMsg, _ *rpc.Buffer) error {
			return srv.Fence(ctx, m.floor, m.epochs)
		}),
		methodSnapshot: handle(func(ctx context.Context, m serverMsg, resp *rpc.Buffer) error {
			committed, err := decodeProgress(m.done)
			if err != nil {
				return err
			}
			accepted, err := decodeProgress(m.acc)
			if err != nil {
				return err
			}
			info, err := srv.Snapshot(ctx, m.step, committed, accepted)
			if err != nil {
				return err
			}
			full := uint8(0)
			if info.Full {
				full = 1
			}
			resp.Write(enc(nil).u64(uint64(info.Bytes)).u8(full))
			return nil
		}),
		methodPersist: handle(func(ctx context.Context, m serverMsg, resp *rpc.Buffer) error {
			ref, err := srv.WaitPersisted(ctx, m.step)
			if err != nil {
				return err
			}
			resp.Write(enc(nil).str(ref.Node).u64(ref.Step).str(ref.Name).u64(uint64(ref.Size)).u64(ref.Sum))
			return nil
		}),
		methodVerify: handle(func(ctx context.Context, m serverMsg, _ *rpc.Buffer) error {
			t, err := table(m.table)
			if err != nil {
				return err
			}
			return srv.Verify(ctx, m.step, t)
		}),
		methodLoad: handle(func(ctx context.Context, m serverMsg, _ *rpc.Buffer) error {
			t, err := table(m.table)
			if err != nil {
				return err
			}
			return srv.Load(ctx, m.step, t)
		}),
		methodDigest: handle(func(ctx context.Context, m serverMsg, resp *rpc.Buffer) error {
			t, err := table(m.table)
			if err != nil {
				return err
			}
			d, err := srv.Digest(ctx, t)
			if err == nil {
				resp.Write(checkpoint.AppendDigest(nil, d))
			}
			return err
		}),
	})
}

// ServeControl registers the control calls of c on reg (the coordinator process's RPC server,
// e.g. the *shardnet.Server of its dispatcher): the workers' (Join, Begin, End, Leave, Suspect)
// and an operator's or autoscaler's (Status, Usage, SetParallelism, SetPlan, AddServers,
// RemoveServers, Rebalance, Fail). Control calls them.
func ServeControl(reg Registrar, c *elastic.Coordinator) error {
	handle := func(f func(ctx context.Context, m workerMsg, resp *rpc.Buffer) error) rpc.Handler {
		return func(ctx context.Context, req []byte, resp *rpc.Buffer) error {
			m, err := decodeWorkerMsg(req)
			if err != nil {
				return remoteErr(err)
			}
			return remoteErr(f(ctx, m, resp))
		}
	}
	return register(reg, map[uint16]rpc.Handler{
		methodJoin: handle(func(ctx context.Context, m workerMsg, resp *rpc.Buffer) error {
			if m.batch > maxBatch {
				return fmt.Errorf("%w: batch size %d", elastic.ErrInvalidConfig, m.batch)
			}
			epoch, err := c.Join(ctx, m.worker, int(m.batch))
			if err == nil {
				resp.Write(enc(nil).u64(epoch))
			}
			return err
		}),
		methodBegin: func(ctx context.Context, req []byte, resp *rpc.Buffer) error {
			m, err := decodeWorkerMsg(req)
			if err != nil {
				return remoteErr(err)
			}
			hctx, cancel := context.WithTimeout(ctx, beginHold)
			defer cancel()
			err = c.Begin(hctx, m.worker, m.epoch)
			if err != nil && hctx.Err() != nil && ctx.Err() == nil {
				return &rpc.RemoteError{Code: codeHeld, Message: "held at the barrier"}
			}
			return remoteErr(err)
		},
		methodEnd: handle(func(ctx context.Context, m workerMsg, _ *rpc.Buffer) error {
			return c.End(ctx, m.worker, m.epoch, m.ok)
		}),
		methodLeave: handle(func(ctx context.Context, m workerMsg, _ *rpc.Buffer) error {
			return c.Leave(ctx, m.worker, m.epoch)
		}),
		methodSuspect: func(ctx context.Context, req []byte, _ *rpc.Buffer) error {
			d := dec{b: req}
			server, reason := d.str(), d.str()
			if err := d.end(); err != nil {
				return remoteErr(err)
			}
			return remoteErr(c.Suspect(ctx, server, reason))
		},
		methodStatus: func(_ context.Context, req []byte, resp *rpc.Buffer) error {
			if len(req) != 0 {
				return remoteErr(errMalformed)
			}
			return remoteErr(writeStatus(resp, c.Status()))
		},
		methodUsage: func(ctx context.Context, req []byte, resp *rpc.Buffer) error {
			if len(req) != 0 {
				return remoteErr(errMalformed)
			}
			st, err := c.Usage(ctx)
			if err != nil {
				return remoteErr(err)
			}
			return remoteErr(writeStatus(resp, st))
		},
		methodFail: func(_ context.Context, req []byte, _ *rpc.Buffer) error {
			d := dec{b: req}
			worker, reason := d.str(), d.str()
			if err := d.end(); err != nil {
				return remoteErr(err)
			}
			c.Fail(worker, reason)
			return nil
		},
		methodSetParallelism: func(ctx context.Context, req []byte, _ *rpc.Buffer) error {
			d := dec{b: req}
			workers, servers := d.u64(), d.u64()
			if err := d.end(); err != nil {
				return remoteErr(err)
			}
			if workers > maxParallelism || servers > maxParallelism {
				return remoteErr(fmt.Errorf("%w: %d workers, %d servers", elastic.ErrInvalidConfig, workers, servers))
			}
			return remoteErr(c.SetParallelism(ctx, int(workers), int(servers)))
		},
		methodAddServers: func(ctx context.Context, req []byte, _ *rpc.Buffer) error {
			d := dec{b: req}
			n := d.u64()
			if n == 0 || n > maxParallelism {
				return remoteErr(fmt.Errorf("%w: %d servers", errMalformed, n))
			}
			nodes := make([]ps.Node, n)
			for i := range nodes {
				nodes[i] = ps.Node{ID: d.str(), Addr: d.str()}
			}
			if err := d.end(); err != nil {
				return remoteErr(err)
			}
			return remoteErr(c.AddServersAt(ctx, nodes...))
		},
		methodRemoveServers: func(ctx context.Context, req []byte, _ *rpc.Buffer) error {
			d := dec{b: req}
			n := d.u64()
			if n == 0 || n > maxParallelism {
				return remoteErr(fmt.Errorf("%w: %d servers", errMalformed, n))
			}
			ids := make([]string, n)
			for i := range ids {
				ids[i] = d.str()
			}
			if err := d.end(); err != nil {
				return remoteErr(err)
			}
			return remoteErr(c.RemoveServers(ctx, ids...))
		},
		methodRebalance: func(ctx context.Context, req []byte, resp *rpc.Buffer) error {
			m, err := decodeRebalanceMsg(req)
			if err != nil {
				return remoteErr(err)
			}
			over, window, maxMoves := m.over, m.window, m.maxMoves
			if window <= 0 || window > time.Hour || maxMoves > 1<<20 || !(over > 1) || math.IsInf(over, 0) {
				return remoteErr(fmt.Errorf("%w: rebalance over %v in %v, at most %d moves", elastic.ErrInvalidConfig, over, window, maxMoves))
			}
			moves, err := c.Rebalance(ctx, over, window, int(maxMoves))
			if err != nil {
				return remoteErr(err)
			}
			resp.Write(appendMoves(nil, moves))
			return nil
		},
		methodSetPlan: func(ctx context.Context, req []byte, _ *rpc.Buffer) error {
			var p elastic.Plan
			if err := json.Unmarshal(req, &p); err != nil {
				return remoteErr(fmt.Errorf("%w: plan: %v", errMalformed, err))
			}
			if p.Workers > maxParallelism || p.Servers > maxParallelism {
				return remoteErr(fmt.Errorf("%w: plan %v", elastic.ErrInvalidConfig, p))
			}
			return remoteErr(c.SetPlan(ctx, p))
		},
	})
}

// maxBatch bounds the batch size a remote Join may give.
const maxBatch = 1 << 30

// maxParallelism bounds the workers and servers a remote SetParallelism may ask for.
const maxParallelism = 1 << 20

// Config configures a Server or Control.
type Config struct {
	// Addr is the RPC address of the process serving the protocol. Required.
	Addr string
	// Secret is the cluster secret. Required.
	Secret []byte
	// Transport dials; nil means TCP.
	Transport transport.Transport
	// TLS, when set, is the client side of mutual TLS (ps.TLS.Client); the process called
	// must serve TLS.
	TLS *tls.Config
	// Logger receives connection failures. Nil discards.
	Logger *slog.Logger
}

type remote struct {
	addr string
	rpc  *rpc.Client
}

func newRemote(cfg Config) (remote, error) {
	if err := rpc.ValidateSecret(cfg.Secret); err != nil {
		return remote{}, fmt.Errorf("%w: %w", elastic.ErrInvalidConfig, err)
	}
	if cfg.Addr == "" {
		return remote{}, fmt.Errorf("%w: a remote needs Addr", elastic.ErrInvalidConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c, err := rpc.NewClient(rpc.ClientConfig{Secret: cfg.Secret, Transport: cfg.Transport, Logger: cfg.Logger, ConnsPerAddr: 1, TLS: cfg.TLS})
	if err != nil {
		return remote{}, fmt.Errorf("%w: %w", elastic.ErrInvalidConfig, err)
	}
	return remote{addr: cfg.Addr, rpc: c}, nil
}

// call makes one call and hands the answer to read (which must not keep it).
func (r remote) call(ctx context.Context, method uint16, req []byte, read func(d *dec)) error {
	resp, err := r.rpc.Call(ctx, r.addr, method, req)
	if errors.Is(err, rpc.ErrUnavailable) {
		return fmt.Errorf("%w: %w", elastic.ErrUnavailable, err)
	}
	if err != nil {
		return localErr(r.addr, err)
	}
	defer r.rpc.Release(resp)
	d := dec{b: resp}
	if read != nil {
		read(&d)
	}
	if err := d.end(); err != nil {
		return fmt.Errorf("remote: answer of %s to method %#x: %w", r.addr, method, err)
	}
	return nil
}

// Server is a parameter server in another process, driven through its server agent
// (ServeServer): the coordinator's elastic.ParameterServer for multi-process jobs.
type Server struct {
	remote
	node  ps.Node
	inc   atomic.Uint64 // Admit's incarnation: every call is meant for it
	coord atomic.Uint64 // Lead's coordinator incarnation: every call is made as it
}

var _ elastic.ParameterServer = (*Server)(nil)

// NewServer returns the remote server node (node.Addr is its RPC address).
func NewServer(node ps.Node, cfg Config) (*Server, error) {
	cfg.Addr = node.Addr
	r, err := newRemote(cfg)
	if err != nil {
		return nil, err
	}
	return &Server{remote: r, node: node}, nil
}

// Close closes the connections. Idempotent.
func (s *Server) Close() error { return s.rpc.Close() }

// Node implements elastic.ParameterServer.
func (s *Server) Node() ps.Node { return s.node }

// InstallTable implements elastic.ParameterServer.
func (s *Server) InstallTable(ctx context.Context, t *ps.OwnerTable) error {
	return s.call(ctx, methodInstall, serverMsg{inc: s.inc.Load(), coord: s.coord.Load(), table: ps.AppendOwnerTable(nil, t)}.append(nil), nil)
}

// Fence implements elastic.ParameterServer.
func (s *Server) Fence(ctx context.Context, floor uint64, epochs []uint64) error {
	return s.call(ctx, methodFence, serverMsg{inc: s.inc.Load(), coord: s.coord.Load(), floor: floor, epochs: epochs}.append(nil), nil)
}

// Snapshot implements elastic.ParameterServer.
func (s *Server) Snapshot(ctx context.Context, step uint64, committed, accepted elastic.Progress) (checkpoint.SnapshotInfo, error) {
	info := checkpoint.SnapshotInfo{Step: step}
	msg := serverMsg{inc: s.inc.Load(), coord: s.coord.Load(), step: step,
		done: progressBytes(committed), acc: progressBytes(accepted)}
	err := s.call(ctx, methodSnapshot, msg.append(nil), func(d *dec) {
		info.Bytes, info.Full = int64(d.u64()), d.u8() == 1
	})
	return info, err
}

// WaitPersisted implements elastic.ParameterServer.
func (s *Server) WaitPersisted(ctx context.Context, step uint64) (checkpoint.ManifestRef, error) {
	var ref checkpoint.ManifestRef
	err := s.call(ctx, methodPersist, serverMsg{inc: s.inc.Load(), coord: s.coord.Load(), step: step}.append(nil), func(d *dec) {
		ref = checkpoint.ManifestRef{Node: d.str(), Step: d.u64(), Name: d.str(), Size: int64(d.u64()), Sum: d.u64()}
	})
	return ref, err
}

// Verify implements elastic.ParameterServer.
func (s *Server) Verify(ctx context.Context, step uint64, t *ps.OwnerTable) error {
	return s.call(ctx, methodVerify, serverMsg{inc: s.inc.Load(), coord: s.coord.Load(), step: step, table: ps.AppendOwnerTable(nil, t)}.append(nil), nil)
}

// Load implements elastic.ParameterServer.
func (s *Server) Load(ctx context.Context, step uint64, t *ps.OwnerTable) error {
	return s.call(ctx, methodLoad, serverMsg{inc: s.inc.Load(), coord: s.coord.Load(), step: step, table: ps.AppendOwnerTable(nil, t)}.append(nil), nil)
}

// Health implements elastic.ParameterServer; it is answered by whichever incarnation runs.
func (s *Server) Health(ctx context.Context) (elastic.ServerHealth, error) {
	var h elastic.ServerHealth
	err := s.call(ctx, methodHealth, serverMsg{}.append(nil), func(d *dec) {
		h.Incarnation, h.TableVersion, h.Leader, h.Snapshot = d.u64(), d.u64(), d.u64(), d.u64()
		if len(d.b) > 0 {
			h.Restoring = d.u64()
		}
	})
	return h, err
}

// Lead implements elastic.ParameterServer: later calls are made as coordinator incarnation inc.
func (s *Server) Lead(ctx context.Context, inc uint64) error {
	if err := s.call(ctx, methodLead, serverMsg{inc: s.inc.Load(), coord: inc}.append(nil), nil); err != nil {
		return err
	}
	s.coord.Store(inc)
	return nil
}

// Table implements elastic.ParameterServer.
func (s *Server) Table(ctx context.Context) (*ps.OwnerTable, error) {
	var t *ps.OwnerTable
	err := s.call(ctx, methodTable, serverMsg{inc: s.inc.Load()}.append(nil), func(d *dec) {
		if len(d.b) == 0 {
			return
		}
		var rest []byte
		var err error
		if t, rest, err = ps.DecodeOwnerTable(d.b); err != nil {
			d.err = errMalformed
			return
		}
		d.b = rest
	})
	return t, err
}

// Admit implements elastic.ParameterServer.
func (s *Server) Admit(inc uint64) { s.inc.Store(inc) }

var _ elastic.Digester = (*Server)(nil)

// Digest implements elastic.Digester.
func (s *Server) Digest(ctx context.Context, t *ps.OwnerTable) (checkpoint.Digest, error) {
	var out checkpoint.Digest
	m := serverMsg{inc: s.inc.Load(), coord: s.coord.Load(), table: ps.AppendOwnerTable(nil, t)}
	err := s.call(ctx, methodDigest, m.append(nil), func(d *dec) {
		var err error
		if out, d.b, err = checkpoint.DecodeDigest(d.b); err != nil {
			d.err = errMalformed
		}
	})
	return out, err
}

// Restore implements elastic.ParameterServer.
func (s *Server) Restore(ctx context.Context, step uint64, t *ps.OwnerTable, mode elastic.RestoreMode) error {
	m := serverMsg{inc: s.inc.Load(), coord: s.coord.Load(), step: step, table: ps.AppendOwnerTable(nil, t), mode: uint8(mode)}
	return s.call(ctx, methodRestore, m.append(nil), nil)
}

// Control is a coordinator in another process (ServeControl), as a worker's Session uses it
// (elastic.Control) and as an operator's command or an autoscaler drives it (Status, Usage,
// SetPlan, Rebalance, ...). The workers' calls wait out a coordinator that cannot be reached
// (not up yet, restarting, a lost connection) by trying again until ctx ends: each is safe to
// repeat. The others are made once.
type Control struct{ remote }

// controlRetry is the wait between attempts to reach the coordinator.
const controlRetry = 200 * time.Millisecond

// retry runs call until it does not fail for want of the coordinator, or ctx ends.
func (c *Control) retry(ctx context.Context, call func() error) error {
	for {
		err := call()
		if !errors.Is(err, elastic.ErrUnavailable) && !errors.Is(err, rpc.ErrConnClosed) {
			return err
		}
		if werr := wait.Sleep(ctx, controlRetry); werr != nil {
			return fmt.Errorf("%w (%w)", werr, err)
		}
	}
}

var _ elastic.Control = (*Control)(nil)

// NewControl returns a client of the coordinator at cfg.Addr.
func NewControl(cfg Config) (*Control, error) {
	r, err := newRemote(cfg)
	if err != nil {
		return nil, err
	}
	return &Control{r}, nil
}

// Close closes the connection. Idempotent.
func (c *Control) Close() error { return c.rpc.Close() }

// Join implements elastic.Control.
func (c *Control) Join(ctx context.Context, worker string, batchSize int) (uint64, error) {
	if batchSize < 0 {
		return 0, fmt.Errorf("%w: batch size %d", elastic.ErrInvalidConfig, batchSize)
	}
	var epoch uint64
	err := c.retry(ctx, func() error {
		return c.call(ctx, methodJoin, workerMsg{worker: worker, batch: uint64(batchSize)}.append(nil), func(d *dec) { epoch = d.u64() })
	})
	return epoch, err
}

// Begin implements elastic.Control: it calls again while the coordinator holds it at a barrier.
func (c *Control) Begin(ctx context.Context, worker string, epoch uint64) error {
	for {
		err := c.retry(ctx, func() error {
			return c.call(ctx, methodBegin, workerMsg{worker: worker, epoch: epoch}.append(nil), nil)
		})
		if !errors.Is(err, errHeld) {
			return err
		}
	}
}

// End implements elastic.Control.
func (c *Control) End(ctx context.Context, worker string, epoch uint64, ok bool) error {
	return c.retry(ctx, func() error {
		return c.call(ctx, methodEnd, workerMsg{worker: worker, epoch: epoch, ok: ok}.append(nil), nil)
	})
}

// Leave implements elastic.Control.
func (c *Control) Leave(ctx context.Context, worker string, epoch uint64) error {
	return c.retry(ctx, func() error {
		return c.call(ctx, methodLeave, workerMsg{worker: worker, epoch: epoch}.append(nil), nil)
	})
}

// Status returns the job's status (elastic.Coordinator.Status) from the coordinator's process.
// Unlike the workers' calls it does not wait for a coordinator that cannot be reached.
func (c *Control) Status(ctx context.Context) (elastic.Status, error) {
	return c.status(ctx, methodStatus)
}

// Usage returns the job's status with every server's counters (elastic.Coordinator.Usage) from the
// coordinator's process, which reads the servers. Like Status it does not wait for a
// coordinator that cannot be reached.
func (c *Control) Usage(ctx context.Context) (elastic.Status, error) {
	return c.status(ctx, methodUsage)
}

// status makes a call answered by a Status in JSON.
func (c *Control) status(ctx context.Context, method uint16) (elastic.Status, error) {
	var b []byte
	err := c.call(ctx, method, nil, func(d *dec) { b = append([]byte(nil), d.bytes()...) })
	if err != nil {
		return elastic.Status{}, err
	}
	var st elastic.Status
	if err := json.Unmarshal(b, &st); err != nil {
		return elastic.Status{}, fmt.Errorf("remote: malformed status: %w", err)
	}
	return st, nil
}

// writeStatus writes st in JSON as the answer of a Status or Usage call.
func writeStatus(resp *rpc.Buffer, st elastic.Status) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	resp.Write(enc(nil).bytes(b))
	return nil
}

// SetParallelism calls elastic.Coordinator.SetParallelism in the coordinator's process.
func (c *Control) SetParallelism(ctx context.Context, workers, servers int) error {
	if workers < 0 || servers < 0 {
		return fmt.Errorf("%w: %d workers, %d servers", elastic.ErrInvalidConfig, workers, servers)
	}
	return c.call(ctx, methodSetParallelism, enc(nil).u64(uint64(workers)).u64(uint64(servers)), nil)
}

// SetPlan calls elastic.Coordinator.SetPlan in the coordinator's process.
func (c *Control) SetPlan(ctx context.Context, plan elastic.Plan) error {
	if err := plan.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(plan)
	if err != nil {
		return err
	}
	return c.call(ctx, methodSetPlan, b, nil)
}

// AddServers calls elastic.Coordinator.AddServers in the coordinator's process for servers a
// scheduler started at the given nodes (the coordinator reaches them through its
// elastic.Config.ServerAt);
// it returns once the slots have moved onto them.
func (c *Control) AddServers(ctx context.Context, nodes ...ps.Node) error {
	e := enc(nil).u64(uint64(len(nodes)))
	for _, n := range nodes {
		e = e.str(n.ID).str(n.Addr)
	}
	return c.call(ctx, methodAddServers, e, nil)
}

// RemoveServers calls elastic.Coordinator.RemoveServers in the coordinator's process; once it
// returns the servers own nothing and may be stopped.
func (c *Control) RemoveServers(ctx context.Context, ids ...string) error {
	e := enc(nil).u64(uint64(len(ids)))
	for _, id := range ids {
		e = e.str(id)
	}
	return c.call(ctx, methodRemoveServers, e, nil)
}

// Rebalance calls elastic.Coordinator.Rebalance in the coordinator's process and returns the slots
// it moved.
func (c *Control) Rebalance(ctx context.Context, over float64, window time.Duration, maxMoves int) ([]ps.Move, error) {
	if maxMoves < 0 {
		return nil, fmt.Errorf("%w: at most %d moves", elastic.ErrInvalidConfig, maxMoves)
	}
	var moves []ps.Move
	req := rebalanceMsg{over: over, window: window, maxMoves: uint64(maxMoves)}.append(nil)
	err := c.call(ctx, methodRebalance, req, func(d *dec) {
		moves, d.err = decodeMoves(d.b)
		d.b = nil
	})
	if err != nil {
		return nil, err
	}
	return moves, nil
}

// Fail calls elastic.Coordinator.Fail in the coordinator's process: the worker's epoch is fenced
// and its shards go back to the dispatcher. Like Status it does not wait for a coordinator that
// cannot be reached. A worker that is not a member (failed already, or never joined) is left alone,
// so a repeated call changes nothing, unless the worker joined again in between.
func (c *Control) Fail(ctx context.Context, worker, reason string) error {
	return c.call(ctx, methodFail, enc(nil).str(worker).str(reason), nil)
}

// Suspect calls elastic.Coordinator.Suspect in the coordinator's process (once: a report that does
// not get through is not worth waiting for).
func (c *Control) Suspect(ctx context.Context, server, reason string) error {
	return c.call(ctx, methodSuspect, enc(nil).str(server).str(reason), nil)
}
