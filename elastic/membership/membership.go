package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/elasticps/elasticps/elastic"

	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/hashicorp/memberlist"
)

// ErrNoSeed is returned by New and Gossip.Join when no seed could be joined: none
// answered, or none accepted this node (a wrong cluster secret looks the same).
var ErrNoSeed = errors.New("membership: could not join any seed")

// validRole reports whether r is one of the roles (the zero Role is none).
func validRole(r elastic.Role) bool { return r >= elastic.RoleServer && r <= elastic.RoleCoordinator }

// nodeName is m's memberlist node name, unique per process incarnation.
func nodeName(m elastic.Member) string { return m.ID + "/" + strconv.FormatUint(m.Incarnation, 16) }

// Config configures a Gossip. The zero value of every field but Self (Role, ID,
// Incarnation, Addr) and Secret means its default; the failure-detection defaults are
// memberlist.DefaultLANConfig's.
type Config struct {
	// Self is this process. Role, ID, Incarnation (not 0) and Addr are required; Host
	// defaults to os.Hostname(). ID, Addr and Host are at most 255 bytes each, and together
	// must fit in memberlist's 512 bytes of node meta. Self.Gossip is ignored (it is filled in
	// from memberlist).
	Self elastic.Member
	// Bind is the gossip address, host:port, for both UDP and TCP. Port 0 picks a free port
	// (LocalAddr tells which). Default "0.0.0.0:7946". Unused with a Transport.
	Bind string
	// Advertise is the address, host:port, other members reach this one's gossip at, when it
	// is not the bound one (NAT, containers). Port 0 means the bound port. Default: the bound
	// address; bound to 0.0.0.0, a private IP address of this host.
	Advertise string
	// Seeds are gossip addresses (host:port) of members to join at start. None: this process
	// starts a cluster that others join.
	Seeds []string
	// Secret is the cluster secret, at least 32 bytes (rpc's minimum). Required. The gossip
	// key is derived from it; every member of a job must have the same.
	Secret []byte

	// ProbeInterval is how often a random member is probed. Default 1s. Shorter detects
	// failures sooner at the price of traffic.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe waits for its ack before trying indirect probes; about
	// the 99th percentile of the round trip. Default 500ms; it must be below ProbeInterval.
	ProbeTimeout time.Duration
	// SuspicionMult scales how long a suspected member has to refute before it is declared
	// failed: SuspicionMult * max(1, log10(members)) * ProbeInterval, less as other members
	// confirm the suspicion. Default 4. Higher means fewer false failures and slower detection.
	SuspicionMult int
	// GossipInterval is how often gossip is sent (to 3 random members). Default 200ms. Shorter
	// spreads news faster at the price of traffic.
	GossipInterval time.Duration
	// PushPullInterval is how often the full state is synchronised with a random member.
	// Default 30s.
	PushPullInterval time.Duration
	// TCPTimeout bounds each TCP exchange: the push-pull of a join (per seed address) and the
	// TCP fallback of a probe. Default 10s.
	TCPTimeout time.Duration
	// LeaveTimeout bounds how long Leave and Close wait for the leave to be gossiped. Default 5s.
	LeaveTimeout time.Duration

	// HandshakeTimeout bounds how long a gossip stream (a TCP connection to the gossip port)
	// may take, from its accept, to deliver a message sealed with the cluster key: one that
	// has not is closed. Default 5s, as the RPC port's. Shorter frees the slots of idle or slow
	// peers sooner; it must leave room for a member's whole state (a push-pull) to arrive.
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds the gossip streams that have not delivered such a message yet;
	// more are closed as they come, so that connections of peers without the secret cannot
	// take the process's file descriptors. Default 128, as the RPC port's.
	MaxHandshakes int
	// MaxHandshakesPerHost bounds them per source address, at most MaxHandshakes, so that one
	// flooding host leaves room for the members on others. Default 32.
	MaxHandshakesPerHost int

	// Transport, if set, carries the gossip instead of UDP and TCP sockets (say,
	// memberlist.MockNetwork's transports in tests); a memberlist.NodeAwareTransport is used as
	// such. Its streams are guarded as the sockets' are (HandshakeTimeout, MaxHandshakes). The
	// Gossip shuts it down at Close.
	Transport memberlist.Transport
	// OnEvent, if set, receives every elastic.MemberEvent, in order, from one goroutine. It must not
	// block for long: events queue up behind it (without bound, so gossip never waits).
	OnEvent func(elastic.MemberEvent)
	// Logger receives the membership's events, and memberlist's own log at debug level. Nil
	// discards.
	Logger *slog.Logger
}

// Validate reports every problem of c at once.
func (c Config) Validate() error {
	var errs []error
	if !validRole(c.Self.Role) {
		errs = append(errs, fmt.Errorf("Self.Role %v is not a valid role", c.Self.Role))
	}
	if c.Self.ID == "" {
		errs = append(errs, errors.New("Self.ID is required"))
	}
	if c.Self.Incarnation == 0 {
		errs = append(errs, errors.New("Self.Incarnation is required (not 0)"))
	}
	if c.Self.Addr == "" {
		errs = append(errs, errors.New("Self.Addr is required"))
	} else if _, _, err := net.SplitHostPort(c.Self.Addr); err != nil {
		errs = append(errs, fmt.Errorf("Self.Addr: %w", err))
	}
	for name, s := range map[string]string{"Self.ID": c.Self.ID, "Self.Addr": c.Self.Addr, "Self.Host": c.Self.Host} {
		if len(s) > maxMetaStr {
			errs = append(errs, fmt.Errorf("%s is %d bytes, more than %d", name, len(s), maxMetaStr))
		}
	}
	if room := metaRoom(c.Self); room < 0 || c.Self.Host == "" && room == 0 {
		errs = append(errs, fmt.Errorf("Self does not fit in the %d bytes of gossip meta", memberlist.MetaMaxSize))
	}
	for name, a := range map[string]string{"Bind": c.Bind, "Advertise": c.Advertise} {
		if a == "" {
			continue
		}
		if _, _, err := splitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	for i, s := range c.Seeds {
		if s == "" {
			errs = append(errs, fmt.Errorf("Seeds[%d] is empty", i))
		}
	}
	if err := rpc.ValidateSecret(c.Secret); err != nil {
		errs = append(errs, fmt.Errorf("Secret: %w", err))
	}
	for name, d := range map[string]time.Duration{"ProbeInterval": c.ProbeInterval, "ProbeTimeout": c.ProbeTimeout,
		"GossipInterval": c.GossipInterval, "PushPullInterval": c.PushPullInterval, "TCPTimeout": c.TCPTimeout, "LeaveTimeout": c.LeaveTimeout} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", name, d))
		}
	}
	if c.ProbeInterval > 0 && c.ProbeTimeout >= c.ProbeInterval {
		errs = append(errs, fmt.Errorf("ProbeTimeout %v is not below ProbeInterval %v", c.ProbeTimeout, c.ProbeInterval))
	}
	if c.SuspicionMult < 0 {
		errs = append(errs, fmt.Errorf("SuspicionMult %d is negative", c.SuspicionMult))
	}
	if c.HandshakeTimeout < 0 {
		errs = append(errs, fmt.Errorf("HandshakeTimeout %v is negative", c.HandshakeTimeout))
	}
	if c.MaxHandshakes < 0 {
		errs = append(errs, fmt.Errorf("MaxHandshakes %d is negative", c.MaxHandshakes))
	}
	if c.MaxHandshakesPerHost < 0 {
		errs = append(errs, fmt.Errorf("MaxHandshakesPerHost %d is negative", c.MaxHandshakesPerHost))
	} else if c.MaxHandshakes > 0 && c.MaxHandshakesPerHost > c.MaxHandshakes {
		errs = append(errs, fmt.Errorf("MaxHandshakesPerHost %d is above MaxHandshakes %d", c.MaxHandshakesPerHost, c.MaxHandshakes))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", elastic.ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// withDefaults fills the defaults memberlist does not: Logger, LeaveTimeout, the guard of the
// gossip port and Self.Host.
func (c Config) withDefaults() (Config, error) {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.LeaveTimeout == 0 {
		c.LeaveTimeout = 5 * time.Second
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = defaultGossipHandshakeTimeout
	}
	if c.MaxHandshakes == 0 {
		c.MaxHandshakes = defaultGossipMaxHandshakes
	}
	if c.MaxHandshakesPerHost == 0 {
		c.MaxHandshakesPerHost = defaultGossipMaxHandshakesHost
	}
	c.MaxHandshakesPerHost = min(c.MaxHandshakesPerHost, c.MaxHandshakes)
	if c.Self.Host == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return c, fmt.Errorf("%w: Self.Host is not set and os.Hostname failed: %v", elastic.ErrInvalidConfig, err)
		}
		c.Self.Host = h[:max(0, min(len(h), maxMetaStr, metaRoom(c.Self)))]
	}
	c.Self.Gossip = ""
	return c, nil
}

// splitHostPort splits "host:port" with a numeric port (0 allowed).
func splitHostPort(a string) (string, int, error) {
	host, p, err := net.SplitHostPort(a)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	return host, int(port), nil
}

// Gossip is this process's membership of the job's gossip: it gossips its elastic.Member as
// node meta, and reports the others joining, leaving and failing (elastic.MemberEvent). A
// restarted process is a new member (its node name holds the incarnation), never the old one
// come back. Events are hints: the coordinator confirms them (elastic.Coordinator.Observe).
// It is safe for concurrent use.
type Gossip struct {
	cfg    Config
	log    *slog.Logger
	ml     *memberlist.Memberlist
	gate   *streamGate // the transport memberlist uses: the guard of the gossip port
	meta   *metaDelegate
	view   memberView
	events *eventQueue    // nil without OnEvent
	quit   chan struct{}  // closed when gossip stops
	wg     sync.WaitGroup // joins and the leave

	mu        sync.Mutex
	down      bool          // gossip stopped or stopping
	leaveDone chan struct{} // closed when the leave is over; nil before it starts
	leaveErr  error         // set before leaveDone is closed

	closeOnce sync.Once
	closeErr  error
}

// New starts gossiping cfg.Self and joins cfg.Seeds, if any; it fails (ErrNoSeed)
// when none of them can be joined. ctx bounds the join.
func New(ctx context.Context, cfg Config) (*Gossip, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Gossip{cfg: cfg, log: cfg.Logger.With("member", nodeName(cfg.Self)), quit: make(chan struct{})}
	m.meta = newMetaDelegate(memberMeta{Member: cfg.Self})
	if cfg.OnEvent != nil {
		m.events = startEventQueue(cfg.OnEvent)
	}
	var mlc *memberlist.Config
	m.gate, err = cfg.gossipTransport()
	if err == nil {
		mlc, err = cfg.memberlistConfig(m.meta, eventDelegate{m}, m.gate)
	}
	if err == nil {
		m.ml, err = memberlist.Create(mlc)
	}
	if err != nil {
		if m.gate != nil {
			m.gate.Shutdown()
		}
		m.events.close()
		return nil, fmt.Errorf("membership: start gossip: %w", err)
	}
	if len(cfg.Seeds) > 0 {
		if _, err := m.Join(ctx, cfg.Seeds...); err != nil {
			m.closeWith(false) // nobody knows of this process: no leave
			return nil, err
		}
	}
	m.log.Info("gossip started", "gossip", m.LocalAddr(), "role", cfg.Self.Role, "rpc", cfg.Self.Addr, "host", cfg.Self.Host)
	return m, nil
}

// Join contacts the gossip addresses seeds and merges their view of the job; it returns how
// many it joined, and ErrNoSeed if none. ctx bounds the wait; a seed being tried when ctx ends
// is given up after Config.TCPTimeout at the latest, which Close waits for.
func (m *Gossip) Join(ctx context.Context, seeds ...string) (int, error) {
	if len(seeds) == 0 {
		return 0, nil
	}
	m.mu.Lock()
	if m.down {
		m.mu.Unlock()
		return 0, elastic.ErrClosed
	}
	m.wg.Add(1)
	m.mu.Unlock()
	type result struct {
		n   int
		err error
	}
	res := make(chan result, 1)
	go func() {
		defer m.wg.Done()
		n, err := m.join(ctx, seeds)
		res <- result{n, err}
	}()
	select {
	case r := <-res:
		return r.n, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// join tries the seeds one at a time, stopping early when ctx ends or gossip stops.
func (m *Gossip) join(ctx context.Context, seeds []string) (int, error) {
	n := 0
	var errs []error
	for _, s := range seeds {
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-m.quit:
			return n, elastic.ErrClosed
		default:
		}
		k, err := m.ml.Join([]string{s})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s, err))
		}
		n += k
	}
	if n == 0 {
		return 0, fmt.Errorf("%w: %w", ErrNoSeed, errors.Join(errs...))
	}
	return n, nil
}

// Members returns the members alive as this process sees it, itself included, sorted by role,
// then id, then incarnation. Suspected members count as alive; members leaving do not. After
// Close it returns nil.
func (m *Gossip) Members() []elastic.Member {
	m.mu.Lock()
	down := m.down
	m.mu.Unlock()
	if down {
		return nil
	}
	return m.view.alive()
}

// Lookup returns the alive member with role and id; if several incarnations are alive (a
// restarted process whose predecessor is not yet declared failed), the newest.
func (m *Gossip) Lookup(role elastic.Role, id string) (elastic.Member, bool) {
	var found elastic.Member
	for _, mb := range m.Members() {
		if mb.Role == role && mb.ID == id && mb.Incarnation > found.Incarnation {
			found = mb
		}
	}
	return found, found.Incarnation != 0
}

// LocalAddr returns this process's gossip address, host:port, as other members reach it: the
// one to give others as a seed (with Bind port 0, it tells the port picked).
func (m *Gossip) LocalAddr() string { return m.view.localAddr() }

// Leave tells the other members that this process leaves, so that they see elastic.MemberLeft
// rather than, later, elastic.MemberFailed, and waits until that is gossiped, for at most
// Config.LeaveTimeout or until ctx ends. The process is then no member any more but keeps
// gossiping until Close; it cannot join again (a new incarnation can). Leaving again is
// harmless.
func (m *Gossip) Leave(ctx context.Context) error {
	m.mu.Lock()
	if m.down {
		m.mu.Unlock()
		return elastic.ErrClosed
	}
	done := m.leaveLocked()
	m.mu.Unlock()
	select {
	case <-done:
		if m.leaveErr != nil {
			return fmt.Errorf("membership: leave: %w", m.leaveErr)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leaveLocked starts the leave unless it is under way or done, and returns its done channel.
// m.mu is held and gossip has not stopped.
//
// memberlist (v0.7.0) does not tell its EventDelegate whether a node left or died (the State
// of the node NotifyLeave gets is always StateAlive, hashicorp/memberlist#293), so a leaving
// member first gossips its meta marked leaving; a member whose last meta is so marked left.
func (m *Gossip) leaveLocked() <-chan struct{} {
	if m.leaveDone == nil {
		done := make(chan struct{})
		m.leaveDone = done
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			defer close(done)
			deadline := time.Now().Add(m.cfg.LeaveTimeout)
			m.meta.set(memberMeta{Member: m.cfg.Self, leaving: true})
			if err := m.ml.UpdateNode(m.cfg.LeaveTimeout); err != nil {
				m.log.Debug("announcing the leave", "err", err)
			}
			m.leaveErr = m.ml.Leave(max(time.Until(deadline), time.Millisecond))
		}()
	}
	return m.leaveDone
}

// Close leaves (unless Leave did), stops gossip and joins every goroutine of the membership,
// after delivering the events already queued. A leave that times out is logged, not returned.
// Close is idempotent.
func (m *Gossip) Close() error { return m.closeWith(true) }

// closeWith closes, leaving first if leave.
func (m *Gossip) closeWith(leave bool) error {
	m.closeOnce.Do(func() {
		m.closeErr = m.shutdown(leave)
		m.wg.Wait()
		m.events.close()
		m.log.Debug("gossip stopped")
	})
	return m.closeErr
}

// shutdown stops gossip, after a leave if leave; later calls do nothing. A leave under way is
// waited for in any case: memberlist must not be shut down under it.
func (m *Gossip) shutdown(leave bool) error {
	m.mu.Lock()
	if m.down {
		m.mu.Unlock()
		return nil
	}
	m.down = true
	close(m.quit)
	var done <-chan struct{} = m.leaveDone // nil if no leave was started
	if leave {
		done = m.leaveLocked()
	}
	m.mu.Unlock()
	if done != nil {
		<-done
		if m.leaveErr != nil {
			m.log.Warn("leaving the gossip", "err", m.leaveErr)
		}
	}
	if err := m.ml.Shutdown(); err != nil {
		return fmt.Errorf("membership: stop gossip: %w", err)
	}
	return nil
}

// crash stops gossip without leaving, as a killed process would (tests).
func (m *Gossip) crash() error { return m.shutdown(false) }
