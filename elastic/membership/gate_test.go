package membership

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// floodFDs counts the process's file descriptors that are TCP connections to local port from
// ip (IPv4, Linux), or returns -1 elsewhere: the member's side of a flood from ip.
func floodFDs(t *testing.T, port int, ip string) int {
	if runtime.GOOS != "linux" {
		return -1
	}
	tab, err := os.ReadFile("/proc/net/tcp")
	require.NoError(t, err)
	ip4 := net.ParseIP(ip).To4()
	remote := fmt.Sprintf("%02X%02X%02X%02X:", ip4[3], ip4[2], ip4[1], ip4[0])
	local := fmt.Sprintf(":%04X", port)
	inodes := map[string]bool{}
	for _, line := range strings.Split(string(tab), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 9 && strings.HasSuffix(f[1], local) && strings.HasPrefix(f[2], remote) {
			inodes["socket:["+f[9]+"]"] = true
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && inodes[l] {
			n++
		}
	}
	return n
}

// A host without the secret floods the gossip port with connections that send nothing. The
// port holds at most MaxHandshakesPerHost of them (the process's descriptors stay bounded),
// closes the others at once and each of those it holds at HandshakeTimeout; memberlist's own
// TCPTimeout (a minute here) never comes into it. Meanwhile the members on other hosts go on
// gossiping (none is taken for failed) and a new one joins through the flooded member.
func TestGossipPortBoundsConnectionsWithoutTheKey(t *testing.T) {
	const (
		maxOpen, perHost = 12, 4
		timeout          = 300 * time.Millisecond
		flood            = 150
		attacker         = "127.0.0.3"
	)
	coord := elastic.Member{Role: elastic.RoleCoordinator, ID: "coordinator", Incarnation: 1, Addr: "127.0.0.1:9000", Host: "host-a"}
	ps0 := elastic.Member{Role: elastic.RoleServer, ID: "ps-0", Incarnation: 1, Addr: "127.0.0.2:9000", Host: "host-b"}
	w0 := elastic.Member{Role: elastic.RoleWorker, ID: "worker-0", Incarnation: 1, Addr: "127.0.0.4:9000", Host: "host-c"}
	recA, recB, recC := newMemberRecorder(), newMemberRecorder(), newMemberRecorder()
	// Failure detection as patient as memberlist's defaults: the flood loads the machine, and
	// a probe answered late is no failure of the port's guard.
	gossip := func(ip string, self elastic.Member, rec *memberRecorder, seeds ...string) Config {
		cfg := fastGossip(ip, self, rec, seeds...)
		cfg.ProbeInterval, cfg.ProbeTimeout, cfg.SuspicionMult = time.Second, 500*time.Millisecond, 4
		return cfg
	}
	cfgA := gossip("127.0.0.1", coord, recA)
	cfgA.MaxHandshakes, cfgA.MaxHandshakesPerHost, cfgA.HandshakeTimeout = maxOpen, perHost, timeout
	cfgA.TCPTimeout = time.Minute
	logbuf := &lockedBuf{}
	cfgA.Logger = slog.New(slog.NewTextHandler(logbuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	defer func() {
		if t.Failed() {
			t.Log(logbuf.String())
		}
	}()
	a := startMember(t, cfgA)
	startMember(t, gossip("127.0.0.2", ps0, recB, a.LocalAddr()))
	recA.wait(t, elastic.MemberJoined, ps0.ID, ps0.Incarnation)
	_, p, err := net.SplitHostPort(a.LocalAddr())
	require.NoError(t, err)
	port, err := strconv.Atoi(p)
	require.NoError(t, err)

	// The flood: connections opened one after another, each read by a goroutine until the
	// member closes it, and closed then. After each, the descriptors of the member's side
	// are counted.
	held := 0 // the most of them
	sample := func() { held = max(held, floodFDs(t, port, attacker)) }
	closed := make(chan error, flood)
	dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(attacker)}, Timeout: membershipWait}
	halfway := make(chan struct{})
	floodDone := make(chan error, 1)
	go func() {
		for i := range flood {
			if i == flood/3 {
				close(halfway)
			}
			c, err := dialer.Dial("tcp", a.LocalAddr())
			if err != nil {
				floodDone <- err
				return
			}
			go func() {
				_, err := c.Read(make([]byte, 1))
				c.Close()
				closed <- err
			}()
			sample()
		}
		floodDone <- nil
	}()

	// A member on another host joins through the flooded one while the flood goes on.
	<-halfway
	startMember(t, gossip("127.0.0.4", w0, recC, a.LocalAddr()))
	recA.wait(t, elastic.MemberJoined, w0.ID, w0.Incarnation)
	recB.wait(t, elastic.MemberJoined, w0.ID, w0.Incarnation)
	recC.wait(t, elastic.MemberJoined, ps0.ID, ps0.Incarnation)
	require.NoError(t, <-floodDone)
	if held >= 0 {
		// perHost streams in their handshake, and the two the transport may have accepted
		// and not yet refused (one being refused, one waiting to be).
		assert.LessOrEqual(t, held, perHost+2, "descriptors the flood holds in the member")
	}

	// Every flood connection is closed by the member: at once, or at its handshake's end.
	deadline := time.After(membershipWait)
	for range flood {
		select {
		case err := <-closed:
			assert.Error(t, err, "the member never writes to a connection that sent nothing")
		case <-deadline:
			st, open := a.gate.counts()
			t.Fatalf("flood connections still open after %v (stats %+v, open %v)", membershipWait, st, open)
		}
	}
	st, open := a.gate.counts()
	t.Logf("gossip port: %+v; the flood held at most %d descriptors", st, held)
	assert.LessOrEqual(t, st.MostHost[attacker], perHost, "streams of one host in their handshake at once")
	assert.LessOrEqual(t, st.Most, maxOpen, "streams in their handshake at once")
	assert.Positive(t, st.Refused, "streams beyond the limit were refused")
	assert.GreaterOrEqual(t, st.Refused, flood-st.Expired-maxOpen, "every flood stream was refused or expired")
	assert.Positive(t, st.Expired, "idle streams were closed at their handshake's end")
	assert.Zero(t, open[attacker], "none of the flood is left")
	for _, e := range recA.snapshot() {
		assert.False(t, e.Kind == elastic.MemberFailed, "no member was taken for failed during the flood: %v", e)
	}
}

// A stream that delivers its message is memberlist's from then on: the guard's deadline no
// longer applies, and it does not count against the limits.
func TestGossipGatePassesAStreamOnItsFirstWrite(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	in := &pipeTransport{streams: make(chan net.Conn, 1)}
	g := newStreamGate(in, 2, 1, time.Hour, slog.New(slog.DiscardHandler))
	defer g.Shutdown()
	in.streams <- server
	gc := (<-g.StreamCh()).(*gatedConn)
	_, open := g.counts()
	assert.Equal(t, 1, open["pipe"])
	want := time.Now().Add(2 * time.Hour)
	require.NoError(t, gc.SetDeadline(want))
	assert.Equal(t, gc.limit, gc.capped(want), "capped while in its handshake")
	go func() { client.Read(make([]byte, 1)) }()
	_, err := gc.Write([]byte{1})
	require.NoError(t, err)
	_, open = g.counts()
	assert.Zero(t, open["pipe"], "past its handshake")
	gc.mu.Lock()
	assert.Equal(t, want, gc.deadline, "memberlist's deadline applies")
	gc.mu.Unlock()
	require.NoError(t, gc.Close())
	st, _ := g.counts()
	assert.Zero(t, st.Expired)
	assert.Zero(t, st.Refused)
}

// pipeTransport hands the guard streams a test makes; nothing else of it is used.
type pipeTransport struct {
	nodeAware
	streams chan net.Conn
}

func (p *pipeTransport) StreamCh() <-chan net.Conn { return p.streams }
func (p *pipeTransport) Shutdown() error           { return nil }

type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *lockedBuf) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(b)
}

func (w *lockedBuf) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
