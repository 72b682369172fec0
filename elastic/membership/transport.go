package membership

// The memberlist side of a Gossip: the node meta a member gossips, the memberlist
// configuration and key, the delegates memberlist calls, and the queue that hands its events to
// Config.OnEvent.

import (
	"cmp"
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/elasticps/elasticps/elastic"

	"github.com/hashicorp/memberlist"
)

// The node meta is an elastic.Member without its Gossip address, and whether it is leaving, in at
// most memberlist.MetaMaxSize bytes:
//
//	version      u8    metaVersion
//	flags        u8    metaLeaving or 0
//	role         u8    a valid Role
//	incarnation  u64   little-endian, not 0
//	id           str   u8 length (not 0), then the bytes
//	addr         str
//	host         str
//
// The decoder accepts nothing else: no other version or flag, no bytes left over.
const (
	metaVersion = 1
	metaLeaving = 1 << 0
	maxMetaStr  = 255
)

var errMalformedMeta = errors.New("membership: malformed member meta")

// memberMeta is what a member gossips about itself.
type memberMeta struct {
	elastic.Member
	leaving bool // it is leaving gracefully (Gossip.Leave)
}

// append appends m's encoding to dst. Strings longer than maxMetaStr are cut (Validate refuses
// them first).
func (m memberMeta) append(dst []byte) []byte {
	flags := byte(0)
	if m.leaving {
		flags |= metaLeaving
	}
	dst = append(dst, metaVersion, flags, byte(m.Role))
	dst = binary.LittleEndian.AppendUint64(dst, m.Incarnation)
	for _, s := range []string{m.ID, m.Addr, m.Host} {
		s = s[:min(len(s), maxMetaStr)]
		dst = append(append(dst, byte(len(s))), s...)
	}
	return dst
}

// metaRoom is how many bytes m's meta encoding leaves free.
func metaRoom(m elastic.Member) int {
	return memberlist.MetaMaxSize - len(memberMeta{Member: m}.append(nil))
}

// decodeMemberMeta decodes a meta encoding; every malformed input is errMalformedMeta.
func decodeMemberMeta(b []byte) (memberMeta, error) {
	const fixed = 3 + 8
	if len(b) < fixed || b[0] != metaVersion || b[1]&^metaLeaving != 0 {
		return memberMeta{}, errMalformedMeta
	}
	m := memberMeta{leaving: b[1]&metaLeaving != 0}
	m.Role, m.Incarnation = elastic.Role(b[2]), binary.LittleEndian.Uint64(b[3:fixed])
	b = b[fixed:]
	for _, s := range []*string{&m.ID, &m.Addr, &m.Host} {
		if len(b) < 1 || b[0] == 0 || len(b)-1 < int(b[0]) {
			return memberMeta{}, errMalformedMeta
		}
		*s, b = string(b[1:1+b[0]]), b[1+b[0]:]
	}
	if len(b) != 0 || !validRole(m.Role) || m.Incarnation == 0 {
		return memberMeta{}, errMalformedMeta
	}
	return m, nil
}

// metaOf decodes a memberlist node's meta, checks that the node's name is the one the meta
// implies and fills in the gossip address.
func metaOf(n *memberlist.Node) (memberMeta, error) {
	m, err := decodeMemberMeta(n.Meta)
	if err != nil {
		return memberMeta{}, err
	}
	if n.Name != nodeName(m.Member) {
		return memberMeta{}, fmt.Errorf("%w: node %q gossips the meta of %q", errMalformedMeta, n.Name, nodeName(m.Member))
	}
	m.Gossip = n.Address()
	return m, nil
}

// gossipKeyInfo is the HKDF info of the gossip key; another derivation needs another info.
const gossipKeyInfo = "elasticps gossip v1"

// gossipKey derives the 32-byte gossip key (AES-256) from the cluster secret.
func gossipKey(secret []byte) ([]byte, error) {
	return hkdf.Key(sha256.New, secret, nil, gossipKeyInfo, 32)
}

// bindAddr is c's gossip address (valid), split, with its defaults.
func (c Config) bindAddr() (string, int) {
	host, port, _ := splitHostPort(cmp.Or(c.Bind, "0.0.0.0:7946"))
	return cmp.Or(host, "0.0.0.0"), port
}

// memberlistLogger is memberlist's log, as debug records of c.Logger.
func (c Config) memberlistLogger() *log.Logger { return log.New(slogWriter{c.Logger}, "", 0) }

// gossipTransport returns the transport memberlist is to use: c.Transport, or UDP and TCP
// sockets bound to c.Bind, behind the guard of the gossip port (see gate.go).
func (c Config) gossipTransport() (*streamGate, error) {
	inner := c.Transport
	if inner == nil {
		host, port := c.bindAddr()
		nc := &memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port, Logger: c.memberlistLogger()}
		// As memberlist does: with port 0 the TCP listener picks the port and the UDP one may
		// find it taken; try again a few times.
		var nt *memberlist.NetTransport
		var err error
		for try := 0; try < 10; try++ {
			if nt, err = memberlist.NewNetTransport(nc); err == nil || port != 0 || !strings.Contains(err.Error(), "address already in use") {
				break
			}
		}
		if err != nil {
			return nil, err
		}
		inner = nt
	}
	return newStreamGate(inner, c.MaxHandshakes, c.MaxHandshakesPerHost, c.HandshakeTimeout, c.Logger), nil
}

// memberlistConfig is c, valid and with its defaults, as a memberlist configuration over the
// transport tr (gossipTransport's).
func (c Config) memberlistConfig(d memberlist.Delegate, events memberlist.EventDelegate, tr *streamGate) (*memberlist.Config, error) {
	ml := memberlist.DefaultLANConfig()
	ml.Name = nodeName(c.Self)
	host, port := c.bindAddr()
	if nt, ok := tr.NodeAwareTransport.(*memberlist.NetTransport); ok && port == 0 {
		port = nt.GetAutoBindPort()
	}
	ml.BindAddr, ml.BindPort = host, port
	ml.AdvertiseAddr, ml.AdvertisePort = "", port
	if c.Advertise != "" {
		host, port, _ := splitHostPort(c.Advertise)
		ml.AdvertiseAddr = host
		if port != 0 {
			ml.AdvertisePort = port
		}
	}
	ml.Transport = tr
	key, err := gossipKey(c.Secret)
	if err != nil {
		return nil, fmt.Errorf("derive the gossip key: %w", err)
	}
	ml.SecretKey = key
	ml.GossipVerifyIncoming, ml.GossipVerifyOutgoing = true, true
	setIfNonZero(&ml.ProbeInterval, c.ProbeInterval)
	setIfNonZero(&ml.ProbeTimeout, c.ProbeTimeout)
	setIfNonZero(&ml.SuspicionMult, c.SuspicionMult)
	setIfNonZero(&ml.GossipInterval, c.GossipInterval)
	setIfNonZero(&ml.PushPullInterval, c.PushPullInterval)
	setIfNonZero(&ml.TCPTimeout, c.TCPTimeout)
	ml.Delegate, ml.Events = d, events
	ml.Logger = c.memberlistLogger()
	return ml, nil
}

func setIfNonZero[T comparable](dst *T, v T) {
	var zero T
	if v != zero {
		*dst = v
	}
}

// slogWriter turns memberlist's log lines ("[LEVEL] memberlist: text") into debug records.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	if !w.log.Enabled(context.Background(), slog.LevelDebug) {
		return len(p), nil
	}
	line, level := strings.TrimSpace(string(p)), ""
	if rest, ok := strings.CutPrefix(line, "["); ok {
		if l, text, ok := strings.Cut(rest, "]"); ok {
			level, line = l, strings.TrimSpace(text)
		}
	}
	w.log.Debug(strings.TrimPrefix(line, "memberlist: "), "component", "memberlist", "memberlist_level", level)
	return len(p), nil
}

// metaDelegate is the memberlist.Delegate that gossips the local member's meta; it carries no
// messages or state of its own.
type metaDelegate struct{ meta atomic.Pointer[[]byte] }

func newMetaDelegate(m memberMeta) *metaDelegate {
	d := &metaDelegate{}
	d.set(m)
	return d
}

// set changes the meta gossiped from the next memberlist.UpdateNode on.
func (d *metaDelegate) set(m memberMeta) {
	b := m.append(nil)
	d.meta.Store(&b)
}

func (d *metaDelegate) NodeMeta(int) []byte               { return *d.meta.Load() }
func (*metaDelegate) NotifyMsg([]byte)                    {}
func (*metaDelegate) GetBroadcasts(int, int) [][]byte     { return nil }
func (*metaDelegate) LocalState(bool) []byte              { return nil }
func (*metaDelegate) MergeRemoteState(buf []byte, _ bool) {}

// eventDelegate keeps the view and turns memberlist's notifications, made under its locks and
// one at a time, into queued events.
type eventDelegate struct{ m *Gossip }

func (d eventDelegate) NotifyJoin(n *memberlist.Node)   { d.notify(elastic.MemberJoined, n) }
func (d eventDelegate) NotifyUpdate(n *memberlist.Node) { d.notify(elastic.MemberUpdated, n) }
func (d eventDelegate) NotifyLeave(n *memberlist.Node)  { d.notify(elastic.MemberFailed, n) }

func (d eventDelegate) notify(kind elastic.MemberEventKind, n *memberlist.Node) {
	meta, err := metaOf(n)
	if err != nil {
		d.m.log.Warn("ignoring a gossip member", "node", n.Name, "gossip", n.Address(), "err", err)
		return
	}
	d.m.view.update(kind, meta, n.Name == nodeName(d.m.cfg.Self))
	mb := meta.Member
	switch {
	case kind == elastic.MemberFailed && (meta.leaving || n.State == memberlist.StateLeft):
		kind = elastic.MemberLeft
	case kind == elastic.MemberUpdated && meta.leaving:
		d.m.log.Debug("member leaving", "role", mb.Role, "id", mb.ID, "incarnation", mb.Incarnation)
		return // its MemberLeft follows
	}
	level := slog.LevelInfo
	if kind == elastic.MemberUpdated {
		level = slog.LevelDebug
	}
	d.m.log.Log(context.Background(), level, "member "+kind.String(), "role", mb.Role, "id", mb.ID,
		"incarnation", mb.Incarnation, "rpc", mb.Addr, "host", mb.Host, "gossip", mb.Gossip)
	d.m.events.push(elastic.MemberEvent{Kind: kind, Member: mb})
}

// memberView is the members alive, as the event delegate heard of them. (memberlist's own
// Members returns nodes that it goes on changing under its lock.)
type memberView struct {
	mu      sync.Mutex
	members map[string]memberMeta // by node name
	local   string                // this process's gossip address
}

func (v *memberView) update(kind elastic.MemberEventKind, m memberMeta, local bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.members == nil {
		v.members = make(map[string]memberMeta)
	}
	if kind == elastic.MemberFailed {
		delete(v.members, nodeName(m.Member))
	} else {
		v.members[nodeName(m.Member)] = m
	}
	if local {
		v.local = m.Gossip
	}
}

// alive returns the members alive and not leaving, sorted by role, id and incarnation.
func (v *memberView) alive() []elastic.Member {
	v.mu.Lock()
	out := make([]elastic.Member, 0, len(v.members))
	for _, m := range v.members {
		if !m.leaving {
			out = append(out, m.Member)
		}
	}
	v.mu.Unlock()
	slices.SortFunc(out, func(a, b elastic.Member) int {
		if a.Role != b.Role {
			return cmp.Compare(a.Role, b.Role)
		}
		if c := strings.Compare(a.ID, b.ID); c != 0 {
			return c
		}
		return cmp.Compare(a.Incarnation, b.Incarnation)
	})
	return out
}

func (v *memberView) localAddr() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.local
}

// eventQueue hands events to a callback on its own goroutine, in order, and never makes the
// producer wait.
type eventQueue struct {
	mu     sync.Mutex
	queue  []elastic.MemberEvent
	closed bool
	wake   chan struct{} // 1 slot: something was queued, or the queue closed
	done   chan struct{} // closed when the goroutine returns
}

func startEventQueue(fn func(elastic.MemberEvent)) *eventQueue {
	q := &eventQueue{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go q.run(fn)
	return q
}

func (q *eventQueue) run(fn func(elastic.MemberEvent)) {
	defer close(q.done)
	for {
		q.mu.Lock()
		batch, closed := q.queue, q.closed
		q.queue = nil
		q.mu.Unlock()
		for _, e := range batch {
			fn(e)
		}
		if len(batch) == 0 {
			if closed {
				return
			}
			<-q.wake
		}
	}
}

// push queues e; a closed or nil queue drops it.
func (q *eventQueue) push(e elastic.MemberEvent) {
	if q == nil {
		return
	}
	q.mu.Lock()
	if !q.closed {
		q.queue = append(q.queue, e)
	}
	q.mu.Unlock()
	q.signal()
}

// close delivers what is queued and stops the goroutine, waiting for it. A nil queue does
// nothing.
func (q *eventQueue) close() {
	if q == nil {
		return
	}
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
	<-q.done
}

func (q *eventQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}
