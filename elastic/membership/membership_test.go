package membership

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"

	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// membershipWait bounds every wait for gossip: generous, since a loaded machine under -race
// is slow; the tests take a fraction of it.
const membershipWait = 20 * time.Second

var (
	testSecret  = []byte("the cluster secret of the tests.")
	otherSecret = []byte("the cluster secret of another job")
)

// memberRecorder records the events of one Gossip and lets a test wait for one.
type memberRecorder struct {
	mu      sync.Mutex
	events  []elastic.MemberEvent
	changed chan struct{} // closed at the next event
}

func newMemberRecorder() *memberRecorder { return &memberRecorder{changed: make(chan struct{})} }

func (r *memberRecorder) record(e elastic.MemberEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	close(r.changed)
	r.changed = make(chan struct{})
}

// wait returns the first event of kind for id at incarnation inc, waiting for it.
func (r *memberRecorder) wait(t *testing.T, kind elastic.MemberEventKind, id string, inc uint64) elastic.Member {
	t.Helper()
	deadline := time.After(membershipWait)
	for {
		r.mu.Lock()
		for _, e := range r.events {
			if e.Kind == kind && e.Member.ID == id && e.Member.Incarnation == inc {
				r.mu.Unlock()
				return e.Member
			}
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no event %v for %s/%d within %v; got %v", kind, id, inc, membershipWait, r.snapshot())
		}
	}
}

func (r *memberRecorder) snapshot() []elastic.MemberEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]elastic.MemberEvent(nil), r.events...)
}

// fastGossip is a membership config bound to ip (any port) with failure detection tuned for
// tests.
func fastGossip(ip string, self elastic.Member, rec *memberRecorder, seeds ...string) Config {
	cfg := Config{
		Self:             self,
		Bind:             ip + ":0",
		Seeds:            seeds,
		Secret:           testSecret,
		ProbeInterval:    100 * time.Millisecond,
		ProbeTimeout:     50 * time.Millisecond,
		SuspicionMult:    3,
		GossipInterval:   20 * time.Millisecond,
		PushPullInterval: time.Second,
		TCPTimeout:       2 * time.Second,
		LeaveTimeout:     2 * time.Second,
	}
	if rec != nil {
		cfg.OnEvent = rec.record
	}
	return cfg
}

// startMember starts a membership and closes it at the end of the test.
func startMember(t *testing.T, cfg Config) *Gossip {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), membershipWait)
	defer cancel()
	m, err := New(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, m.Close()) })
	return m
}

// withoutGossip drops the Gossip addresses, which the test cannot know in advance.
func withoutGossip(ms []elastic.Member) []elastic.Member {
	out := make([]elastic.Member, len(ms))
	for i, m := range ms {
		m.Gossip = ""
		out[i] = m
	}
	return out
}

// gossipGoroutines returns the stacks of goroutines running memberlist's or the membership's
// code.
func gossipGoroutines() []string {
	buf := make([]byte, 1<<20)
	stacks := strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
	var out []string
	for _, s := range stacks[1:] { // stacks[0] is the caller
		if strings.Contains(s, "hashicorp/memberlist.") || strings.Contains(s, "elastic.(*Gossip)") ||
			strings.Contains(s, "elastic.(*eventQueue)") || strings.Contains(s, "elastic.(*streamGate)") ||
			strings.Contains(s, "elastic.(*gatedConn)") {
			out = append(out, s)
		}
	}
	return out
}

// requireNoGossipGoroutines waits for memberlist's goroutines, which its Shutdown stops but does
// not join, to end.
func requireNoGossipGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(membershipWait)
	for len(gossipGoroutines()) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.Empty(t, gossipGoroutines(), "Close stops every goroutine")
}

// TestMembershipAcrossHosts runs three real memberlist instances on three loopback addresses,
// each a different host: they see each other, a crash is a failure, a restart a new incarnation
// and a leave a leave.
func TestMembershipAcrossHosts(t *testing.T) {
	ctx := context.Background()
	coord := elastic.Member{Role: elastic.RoleCoordinator, ID: "coordinator", Incarnation: 7, Addr: "127.0.0.1:9000", Host: "host-a"}
	ps0 := elastic.Member{Role: elastic.RoleServer, ID: "ps-0", Incarnation: 1, Addr: "127.0.0.2:9000", Host: "host-b"}
	w0 := elastic.Member{Role: elastic.RoleWorker, ID: "worker-0", Incarnation: 1, Addr: "127.0.0.3:9000", Host: "host-c"}
	recA, recB, recC := newMemberRecorder(), newMemberRecorder(), newMemberRecorder()

	func() { // every membership is closed before the goroutine check
		a := startMember(t, fastGossip("127.0.0.1", coord, recA))
		require.True(t, strings.HasPrefix(a.LocalAddr(), "127.0.0.1:"), a.LocalAddr())
		b := startMember(t, fastGossip("127.0.0.2", ps0, recB, a.LocalAddr()))
		c := startMember(t, fastGossip("127.0.0.3", w0, recC, b.LocalAddr()))
		gossip := map[string]string{coord.ID: a.LocalAddr(), ps0.ID: b.LocalAddr(), w0.ID: c.LocalAddr()}

		for _, m := range []struct {
			*Gossip
			rec *memberRecorder
		}{{a, recA}, {b, recB}, {c, recC}} {
			for _, want := range []elastic.Member{coord, ps0, w0} {
				got := m.rec.wait(t, elastic.MemberJoined, want.ID, want.Incarnation)
				assert.Equal(t, gossip[want.ID], got.Gossip)
				got.Gossip = ""
				assert.Equal(t, want, got)
			}
			assert.Equal(t, []elastic.Member{ps0, w0, coord}, withoutGossip(m.Members()), "sorted by role, then id")
			got, ok := m.Lookup(elastic.RoleServer, "ps-0")
			require.True(t, ok)
			assert.Equal(t, "host-b", got.Host)
			assert.Equal(t, gossip["ps-0"], got.Gossip)
			_, ok = m.Lookup(elastic.RoleWorker, "ps-0")
			assert.False(t, ok, "the role must match too")
		}

		// ps-0 crashes: the others declare it failed.
		require.NoError(t, b.crash())
		recA.wait(t, elastic.MemberFailed, "ps-0", 1)
		recC.wait(t, elastic.MemberFailed, "ps-0", 1)
		_, ok := a.Lookup(elastic.RoleServer, "ps-0")
		assert.False(t, ok)
		require.NoError(t, b.Close(), "Close after a crash")

		// It restarts on its host as a new incarnation, at the same gossip address.
		ps0v2 := ps0
		ps0v2.Incarnation = 2
		recB2 := newMemberRecorder()
		cfg := fastGossip("127.0.0.2", ps0v2, recB2, a.LocalAddr())
		cfg.Bind = gossip["ps-0"]
		b2 := startMember(t, cfg)
		for _, rec := range []*memberRecorder{recA, recC} {
			rec.wait(t, elastic.MemberJoined, "ps-0", 2)
		}
		recB2.wait(t, elastic.MemberJoined, "worker-0", 1)
		for _, m := range []*Gossip{a, b2, c} {
			got, ok := m.Lookup(elastic.RoleServer, "ps-0")
			require.True(t, ok)
			assert.Equal(t, uint64(2), got.Incarnation)
			assert.Equal(t, gossip["ps-0"], got.Gossip)
		}

		// worker-0 leaves gracefully: a leave, not a failure.
		require.NoError(t, c.Leave(ctx))
		require.NoError(t, c.Leave(ctx), "Leave twice")
		recA.wait(t, elastic.MemberLeft, "worker-0", 1)
		recB2.wait(t, elastic.MemberLeft, "worker-0", 1)
		recC.wait(t, elastic.MemberLeft, "worker-0", 1) // itself
		assert.Equal(t, []elastic.Member{ps0v2, coord}, withoutGossip(a.Members()))
		for _, rec := range []*memberRecorder{recA, recB2} {
			for _, e := range rec.snapshot() {
				assert.False(t, e.Kind == elastic.MemberFailed && e.Member.ID == "worker-0", "worker-0 left, it did not fail: %v", e)
			}
		}

		for _, m := range []*Gossip{c, b2, a} {
			require.NoError(t, m.Close())
			require.NoError(t, m.Close(), "Close is idempotent")
			assert.Nil(t, m.Members())
			_, err := m.Join(ctx, gossip["coordinator"])
			assert.ErrorIs(t, err, elastic.ErrClosed)
			assert.ErrorIs(t, m.Leave(ctx), elastic.ErrClosed)
		}
	}()
	requireNoGossipGoroutines(t)
}

// TestMembershipRefusesAWrongSecret: a process with another cluster secret cannot join, and the
// cluster never sees it.
func TestMembershipRefusesAWrongSecret(t *testing.T) {
	func() {
		recA := newMemberRecorder()
		a := startMember(t, fastGossip("127.0.0.1", elastic.Member{Role: elastic.RoleCoordinator, ID: "coordinator", Incarnation: 1, Addr: "127.0.0.1:9000"}, recA))

		cfg := fastGossip("127.0.0.2", elastic.Member{Role: elastic.RoleServer, ID: "ps-0", Incarnation: 1, Addr: "127.0.0.2:9000"}, newMemberRecorder(), a.LocalAddr())
		cfg.Secret = otherSecret
		_, err := New(context.Background(), cfg)
		require.ErrorIs(t, err, ErrNoSeed)

		// A process with the right secret joins the same way, and is the only one a sees.
		cfg.Self.ID, cfg.Secret = "ps-1", testSecret
		b := startMember(t, cfg)
		recA.wait(t, elastic.MemberJoined, "ps-1", 1)
		for _, e := range recA.snapshot() {
			assert.NotEqual(t, "ps-0", e.Member.ID, "a never heard of the intruder")
		}
		ids := []string{}
		for _, m := range a.Members() {
			ids = append(ids, m.ID)
		}
		assert.Equal(t, []string{"ps-1", "coordinator"}, ids)
		assert.NotEmpty(t, a.Members()[0].Host, "Host defaults to the host name")
		require.NoError(t, b.Close())
		require.NoError(t, a.Close())
	}()
	requireNoGossipGoroutines(t)
}

// TestMembershipLookupPrefersTheNewestIncarnation: while an old incarnation of ps-0 is still
// alive, Lookup returns the new one. One member gossips through a Transport of its own.
// (memberlist.MockNetwork would not do: a transport blocks for ever sending to one shut down.)
func TestMembershipLookupPrefersTheNewestIncarnation(t *testing.T) {
	rec := newMemberRecorder()
	coord := startMember(t, fastGossip("127.0.0.1", elastic.Member{Role: elastic.RoleCoordinator, ID: "coordinator", Incarnation: 1, Addr: "c:1", Host: "h"}, rec))
	ms := []*Gossip{coord}

	cfg := fastGossip("127.0.0.2", elastic.Member{Role: elastic.RoleServer, ID: "ps-0", Incarnation: 3, Addr: "new:1", Host: "h"}, nil, coord.LocalAddr())
	ms = append(ms, startMember(t, cfg))
	cfg.Self.Incarnation, cfg.Self.Addr, cfg.Bind = 2, "old:1", ""
	tr, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.3"}})
	require.NoError(t, err)
	cfg.Transport = tr
	ms = append(ms, startMember(t, cfg))
	assert.Equal(t, fmt.Sprintf("127.0.0.3:%d", tr.GetAutoBindPort()), ms[2].LocalAddr())
	rec.wait(t, elastic.MemberJoined, "ps-0", 3)
	rec.wait(t, elastic.MemberJoined, "ps-0", 2)

	got, ok := coord.Lookup(elastic.RoleServer, "ps-0")
	require.True(t, ok)
	assert.Equal(t, uint64(3), got.Incarnation)
	assert.Equal(t, "new:1", got.Addr)
	incs := []uint64{}
	for _, m := range coord.Members() {
		incs = append(incs, m.Incarnation)
	}
	assert.Equal(t, []uint64{2, 3, 1}, incs, "sorted by role, id, incarnation")

	_, err = coord.Join(context.Background(), "127.0.0.4:1") // nothing listens there
	assert.ErrorIs(t, err, ErrNoSeed)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = coord.Join(cancelled, ms[1].LocalAddr())
	assert.ErrorIs(t, err, context.Canceled)

	for _, m := range ms {
		require.NoError(t, m.Close())
	}
	requireNoGossipGoroutines(t)
}

func TestMembershipConfigValidateReportsEveryProblem(t *testing.T) {
	err := Config{
		Self:          elastic.Member{Role: 9, Addr: "no port", Host: strings.Repeat("h", 300)},
		Bind:          "127.0.0.1:http",
		Seeds:         []string{""},
		Secret:        []byte("short"),
		ProbeInterval: time.Second,
		ProbeTimeout:  2 * time.Second,
		SuspicionMult: -1,
		TCPTimeout:    -time.Second,

		HandshakeTimeout:     -time.Second,
		MaxHandshakes:        2,
		MaxHandshakesPerHost: 3,
	}.Validate()
	require.ErrorIs(t, err, elastic.ErrInvalidConfig)
	// Role, ID, Incarnation, Addr, Host's length, Bind, Seeds[0], Secret, ProbeTimeout,
	// SuspicionMult, TCPTimeout, HandshakeTimeout, MaxHandshakesPerHost.
	assert.Equal(t, 13, countProblems(err), "%v", err)
	err = Config{MaxHandshakes: -1, MaxHandshakesPerHost: -1}.Validate()
	assert.ErrorContains(t, err, "MaxHandshakes -1 is negative")
	assert.ErrorContains(t, err, "MaxHandshakesPerHost -1 is negative")

	valid := fastGossip("127.0.0.1", elastic.Member{Role: elastic.RoleWorker, ID: "worker-0", Incarnation: 1, Addr: "127.0.0.1:1"}, newMemberRecorder())
	assert.NoError(t, valid.Validate())
	_, err = New(context.Background(), Config{})
	assert.ErrorIs(t, err, elastic.ErrInvalidConfig)
}

// countProblems counts the errors a Validate error joins.
func countProblems(err error) int {
	if wrapped, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range wrapped.Unwrap() {
			if joined, ok := e.(interface{ Unwrap() []error }); ok {
				return len(joined.Unwrap())
			}
		}
	}
	return 0
}

func TestMemberMetaRoundTrips(t *testing.T) {
	for _, m := range []memberMeta{
		{Member: elastic.Member{Role: elastic.RoleServer, ID: "ps-12", Incarnation: 1 << 60, Addr: "10.0.0.7:7070", Host: "node-3"}},
		{Member: elastic.Member{Role: elastic.RoleCoordinator, ID: "c", Incarnation: 1, Addr: ":1", Host: "h"}, leaving: true},
	} {
		b := m.append(nil)
		got, err := decodeMemberMeta(b)
		require.NoError(t, err)
		assert.Equal(t, m, got)
		for n := range len(b) {
			_, err := decodeMemberMeta(b[:n])
			assert.ErrorIs(t, err, errMalformedMeta, "cut at %d", n)
		}
		_, err = decodeMemberMeta(append(b, 0))
		assert.ErrorIs(t, err, errMalformedMeta, "a byte left over")
	}

	big := elastic.Member{Role: elastic.RoleWorker, ID: strings.Repeat("i", 255), Incarnation: 1, Addr: strings.Repeat("a", 255), Host: "h"}
	assert.Less(t, metaRoom(big), 0)
	assert.ErrorIs(t, Config{Self: big, Secret: testSecret}.Validate(), elastic.ErrInvalidConfig, "meta beyond memberlist.MetaMaxSize")
	assert.Equal(t, "ps", elastic.RoleServer.String())
	assert.Equal(t, "worker", elastic.RoleWorker.String())
	assert.Equal(t, "coordinator", elastic.RoleCoordinator.String())
	assert.Equal(t, "failed", elastic.MemberFailed.String())
}

func FuzzDecodeMemberMeta(f *testing.F) {
	f.Add(memberMeta{Member: elastic.Member{Role: elastic.RoleServer, ID: "ps-0", Incarnation: 1, Addr: "127.0.0.1:7070", Host: "h"}}.append(nil))
	f.Add(memberMeta{Member: elastic.Member{Role: elastic.RoleWorker, ID: "w", Incarnation: 9, Addr: "a", Host: "h"}, leaving: true}.append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMemberMeta(b)
		if err != nil {
			assert.ErrorIs(t, err, errMalformedMeta)
			return
		}
		assert.Equal(t, b, m.append(nil), "one encoding per member")
		assert.NotZero(t, m.Incarnation)
		assert.True(t, validRole(m.Role))
	})
}
