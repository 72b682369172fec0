package rpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/transport"
	"github.com/elasticps/elasticps/internal/wire"
)

func TestRoundTrip(t *testing.T) {
	leak := checkGoroutines(t)
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{})
	ctx := context.Background()
	for _, n := range []int{0, 1, 100, coalesceMax, coalesceMax + 1, 200 << 10} {
		req := bytes.Repeat([]byte{byte(n)}, n)
		resp, err := c.Call(ctx, e.addr, mEcho, req)
		require.NoError(t, err, "size %d", n)
		assert.True(t, bytes.Equal(req, resp), "size %d", n)
		c.Release(resp)
	}
	require.NoError(t, c.Close())
	require.NoError(t, e.srv.Close())
	assert.ErrorIs(t, <-e.serveErr, ErrClosed)
	leak()
}

func TestRoundTripTCP(t *testing.T) {
	leak := checkGoroutines(t)
	var tr transport.TCP
	srv, err := NewServer(ServerConfig{Secret: testSecret})
	require.NoError(t, err)
	require.NoError(t, srv.Register(mEcho, echo))
	l, err := tr.Listen("127.0.0.1:0")
	require.NoError(t, err)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(l) }()
	c, err := NewClient(ClientConfig{Secret: testSecret})
	require.NoError(t, err)
	big := make([]byte, 4<<20)
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	resp, err := c.Call(context.Background(), l.Addr().String(), mEcho, big)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(big, resp))
	require.NoError(t, c.Close())
	require.NoError(t, srv.Close())
	assert.ErrorIs(t, <-serveErr, ErrClosed)
	leak()
}

func TestConcurrentCallers(t *testing.T) {
	leak := checkGoroutines(t)
	e := newEnv(t, ServerConfig{MaxConcurrent: 8})
	c := e.client(t, ClientConfig{ConnsPerAddr: 3})
	const callers, each = 32, 100
	var wg sync.WaitGroup
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				req := fmt.Appendf(nil, "caller %d call %d %s", g, i, bytes.Repeat([]byte("x"), (g*each+i)%3000))
				resp, err := c.Call(context.Background(), e.addr, mEcho, req)
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, string(req), string(resp))
				c.Release(resp)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, callers*each, e.handlerRuns(mEcho))
	require.NoError(t, c.Close())
	require.NoError(t, e.srv.Close())
	leak()
}

func TestLargePayloads(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	random := make([]byte, 2<<20)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	compressible := bytes.Repeat([]byte("embedding row 0.125 0.25 0.5 "), (2<<20)/29)
	for _, tc := range []struct {
		name           string
		server, client bool
		want           bool
	}{
		{"plain", false, false, false},
		{"s2", true, true, true},
		{"server only", true, false, false},
		{"client only", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, ServerConfig{Compression: tc.server})
			c := e.client(t, ClientConfig{Compression: tc.client, ConnsPerAddr: 1})
			for _, data := range [][]byte{random, compressible} {
				resp, err := c.Call(context.Background(), e.addr, mEcho, data)
				require.NoError(t, err)
				require.True(t, bytes.Equal(data, resp))
				c.Release(resp)
			}
			resp, err := c.Call(context.Background(), e.addr, mSize, sizeReq(3<<20))
			require.NoError(t, err)
			require.Len(t, resp, 3<<20)
			for i := range resp {
				if resp[i] != byte(i*7) {
					t.Fatalf("byte %d is %d", i, resp[i])
				}
			}
			p := c.peer(e.addr)
			p.slots[0].mu.Lock()
			cc := p.slots[0].cc
			p.slots[0].mu.Unlock()
			require.NotNil(t, cc)
			assert.Equal(t, tc.want, cc.sess.compress)
		})
	}
}

func TestRemoteErrors(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{})
	ctx := context.Background()

	_, err := c.Call(ctx, e.addr, mFail, []byte{0, 0, 0, 42})
	var re *RemoteError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, uint32(1001), re.Code)
	assert.Equal(t, "wrong owner", re.Message)
	assert.Equal(t, []byte{0, 0, 0, 42}, re.Data)
	assert.NotErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, ErrConnClosed)

	_, err = c.Call(ctx, e.addr, 999, nil)
	require.ErrorAs(t, err, &re)
	assert.Equal(t, CodeUnknownMethod, re.Code)

	_, err = c.Call(ctx, e.addr, mPanic, nil)
	require.ErrorAs(t, err, &re)
	assert.Equal(t, CodeInternal, re.Code)
	e.logs.waitLog(t, "handler panicked")

	require.NoError(t, e.srv.Register(50, func(context.Context, []byte, *Buffer) error {
		return fmt.Errorf("plain failure")
	}))
	_, err = c.Call(ctx, e.addr, 50, nil)
	require.ErrorAs(t, err, &re)
	assert.Equal(t, CodeInternal, re.Code)
	assert.Equal(t, "plain failure", re.Message)

	// A wrapped RemoteError keeps its code.
	require.NoError(t, e.srv.Register(51, func(context.Context, []byte, *Buffer) error {
		return fmt.Errorf("context: %w", &RemoteError{Code: 2000, Message: "moved"})
	}))
	_, err = c.Call(ctx, e.addr, 51, nil)
	require.ErrorAs(t, err, &re)
	assert.Equal(t, uint32(2000), re.Code)

	// The connection survived all of it.
	resp, err := c.Call(ctx, e.addr, mEcho, []byte("still here"))
	require.NoError(t, err)
	assert.Equal(t, "still here", string(resp))
}

func TestRegister(t *testing.T) {
	srv, err := NewServer(ServerConfig{Secret: testSecret})
	require.NoError(t, err)
	defer srv.Close()
	require.NoError(t, srv.Register(1, echo))
	assert.Error(t, srv.Register(1, echo))
	assert.Error(t, srv.Register(2, nil))
}

func TestConfigValidate(t *testing.T) {
	err := ServerConfig{MaxFrameSize: -1, MaxConcurrent: -1, CompressThreshold: -1, HandshakeTimeout: -1, WriteTimeout: -1}.Validate()
	require.Error(t, err)
	for _, s := range []string{"Secret", "MaxFrameSize", "MaxConcurrent", "CompressThreshold", "HandshakeTimeout", "WriteTimeout"} {
		assert.Contains(t, err.Error(), s)
	}
	err = ClientConfig{ConnsPerAddr: 1000, DialTimeout: -1, MaxFrameSize: 2 << 30}.Validate()
	require.Error(t, err)
	for _, s := range []string{"Secret", "MaxFrameSize", "ConnsPerAddr", "DialTimeout"} {
		assert.Contains(t, err.Error(), s)
	}
	_, err = NewClient(ClientConfig{})
	assert.Error(t, err)
	_, err = NewServer(ServerConfig{})
	assert.Error(t, err)
	assert.NoError(t, ClientConfig{Secret: testSecret}.Validate())
	assert.NoError(t, ServerConfig{Secret: testSecret}.Validate())
}

func TestSizeLimits(t *testing.T) {
	e := newEnv(t, ServerConfig{MaxFrameSize: 64 << 10})
	c := e.client(t, ClientConfig{MaxFrameSize: 32 << 10})
	ctx := context.Background()

	// Larger than the client's own limit: refused before dialing.
	_, err := c.Call(ctx, e.addr, mEcho, make([]byte, 33<<10))
	assert.ErrorIs(t, err, ErrTooLarge)

	// A response larger than the client accepts becomes an error; the
	// connection stays.
	_, err = c.Call(ctx, e.addr, mSize, sizeReq(40<<10))
	var re *RemoteError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, CodeTooLarge, re.Code)

	big := e.client(t, ClientConfig{MaxFrameSize: 1 << 20})
	// Larger than the server's announced limit: refused locally.
	_, err = big.Call(ctx, e.addr, mEcho, make([]byte, 65<<10))
	assert.ErrorIs(t, err, ErrTooLarge)
	resp, err := big.Call(ctx, e.addr, mEcho, make([]byte, 64<<10))
	require.NoError(t, err)
	assert.Len(t, resp, 64<<10)
	resp, err = c.Call(ctx, e.addr, mEcho, []byte("ok"))
	require.NoError(t, err)
	assert.Equal(t, "ok", string(resp))
	assert.Zero(t, e.handlerRuns(mEcho)-2)
}

func TestContextCancel(t *testing.T) {
	leak := checkGoroutines(t)
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{ConnsPerAddr: 1})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, e.addr, mBlock, []byte("first"))
		errc <- err
	}()
	<-e.block.started // the handler runs: the request was sent
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)

	// Deadline: returns DeadlineExceeded while the handler still runs.
	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer dcancel()
	_, err := c.Call(dctx, e.addr, mBlock, []byte("second"))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	<-e.block.started

	// Both handlers answer late; the answers are dropped and the
	// connection carries on.
	close(e.block.release)
	resp, err := c.Call(context.Background(), e.addr, mEcho, []byte("third"))
	require.NoError(t, err)
	assert.Equal(t, "third", string(resp))

	// An already-cancelled context fails before anything is sent.
	_, err = c.Call(ctx, e.addr, mEcho, nil)
	assert.ErrorIs(t, err, context.Canceled)
	require.NoError(t, c.Close())
	require.NoError(t, e.srv.Close())
	leak()
}

func TestCancelWhileWritingLargeRequest(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{ConnsPerAddr: 1})
	_, err := c.Call(context.Background(), e.addr, mEcho, []byte("warm up"))
	require.NoError(t, err)
	// With the link partitioned, a 16 MiB request fills the 4 MiB window and
	// its write blocks; cancelling must still return promptly.
	e.net.Partition("cli", "srv")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.Call(ctx, e.addr, mEcho, make([]byte, 16<<20))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
	e.net.Heal("cli", "srv")
	// The half-written frame cost that connection; the client redials.
	resp, err := c.Call(context.Background(), e.addr, mEcho, []byte("after"))
	require.NoError(t, err)
	assert.Equal(t, "after", string(resp))
}

func TestServerKilledMidRequest(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{})
	const inflight = 4
	errc := make(chan error, inflight)
	for range inflight {
		go func() {
			_, err := c.Call(context.Background(), e.addr, mBlock, []byte("x"))
			errc <- err
		}()
	}
	for range inflight {
		<-e.block.started
	}
	e.net.Kill("srv")
	for range inflight {
		err := <-errc // no context deadline: the connection's death must end the call
		assert.ErrorIs(t, err, ErrConnClosed)
		assert.Contains(t, err.Error(), e.addr)
	}
	// While down: refused at dial.
	_, err := c.Call(context.Background(), e.addr, mEcho, nil)
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), e.addr)
	assert.Error(t, <-e.serveErr)
}

func TestServerClosedMidRequestTCP(t *testing.T) {
	var tr transport.TCP
	srv, err := NewServer(ServerConfig{Secret: testSecret})
	require.NoError(t, err)
	b := newBlocker()
	require.NoError(t, srv.Register(mBlock, b.handle))
	l, err := tr.Listen("127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	c, err := NewClient(ClientConfig{Secret: testSecret})
	require.NoError(t, err)
	defer c.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), l.Addr().String(), mBlock, nil)
		errc <- err
	}()
	<-b.started
	require.NoError(t, srv.Close())
	err = <-errc
	assert.ErrorIs(t, err, ErrConnClosed)
	assert.Contains(t, err.Error(), l.Addr().String())
}

func TestReconnectAfterRestart(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{})
	ctx := context.Background()
	_, err := c.Call(ctx, e.addr, mEcho, []byte("before"))
	require.NoError(t, err)

	e.net.Kill("srv")
	<-e.serveErr
	_, err = c.Call(ctx, e.addr, mEcho, []byte("down"))
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrUnavailable) || errors.Is(err, ErrConnClosed), "%v", err)

	// A new server process on the restarted host, same address.
	e.net.Restart("srv")
	require.NoError(t, e.srv.Close())
	e2 := *e
	srv, err := NewServer(ServerConfig{Secret: testSecret})
	require.NoError(t, err)
	defer srv.Close()
	require.NoError(t, srv.Register(mEcho, echo))
	e2.srv = srv
	e2.serve(t)
	for i := range 4 {
		resp, err := c.Call(ctx, e.addr, mEcho, fmt.Appendf(nil, "after %d", i))
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("after %d", i), string(resp))
	}
}

func TestPartitionHeal(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{ConnsPerAddr: 1})
	_, err := c.Call(context.Background(), e.addr, mEcho, []byte("hi"))
	require.NoError(t, err)

	e.net.Partition("cli", "srv")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err = c.Call(ctx, e.addr, mEcho, []byte("cut"))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	// A fresh client cannot even connect.
	other := e.client(t, ClientConfig{Transport: e.net.Host("cli")})
	_, err = other.Call(context.Background(), e.addr, mEcho, nil)
	assert.ErrorIs(t, err, ErrUnavailable)

	e.net.Heal("cli", "srv")
	resp, err := c.Call(context.Background(), e.addr, mEcho, []byte("healed"))
	require.NoError(t, err)
	assert.Equal(t, "healed", string(resp))
	// The request held during the partition was delivered after the heal
	// (a real network retransmits), so the handler ran for it too.
	waitFor(t, func() bool { return len(e.calls) >= 3 }, "held request to run")
}

func TestDropTimesOutThenRecovers(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{ConnsPerAddr: 1})
	_, err := c.Call(context.Background(), e.addr, mEcho, []byte("hi"))
	require.NoError(t, err)

	e.net.SetDrop("cli", "srv", true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err = c.Call(ctx, e.addr, mEcho, []byte("lost"))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, 1, e.handlerRuns(mEcho))

	// Lifting the drop resets the connection that lost bytes; the client
	// reconnects.
	e.net.SetDrop("cli", "srv", false)
	var resp []byte
	for range 3 {
		resp, err = c.Call(context.Background(), e.addr, mEcho, []byte("back"))
		if err == nil {
			break
		}
		assert.True(t, errors.Is(err, ErrConnClosed) || errors.Is(err, ErrUnavailable), "%v", err)
	}
	require.NoError(t, err)
	assert.Equal(t, "back", string(resp))
}

func TestDelay(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{})
	_, err := c.Call(context.Background(), e.addr, mEcho, nil)
	require.NoError(t, err)
	// The answer comes a second after the deadline: however late the deadline's timer runs on
	// a loaded machine (40 ms was seen to lose), the call ends with it.
	e.net.SetDelay("srv", "cli", time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = c.Call(ctx, e.addr, mEcho, nil)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	e.net.SetDelay("srv", "cli", 40*time.Millisecond)
	start := time.Now()
	_, err = c.Call(context.Background(), e.addr, mEcho, nil)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 40*time.Millisecond)
}

func TestShutdownGraceful(t *testing.T) {
	leak := checkGoroutines(t)
	// One handler slot: the first call holds it, the second is read (or
	// not) but never dispatched.
	e := newEnv(t, ServerConfig{MaxConcurrent: 1})
	c := e.client(t, ClientConfig{ConnsPerAddr: 1})
	first := make(chan error, 1)
	var firstResp []byte
	go func() {
		var err error
		firstResp, err = c.Call(context.Background(), e.addr, mBlock, []byte("first"))
		first <- err
	}()
	<-e.block.started
	second := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), e.addr, mEcho, []byte("second"))
		second <- err
	}()

	shut := make(chan error, 1)
	go func() { shut <- e.srv.Shutdown(context.Background()) }()
	// The unread request is failed as not processed.
	err := <-second
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.Zero(t, e.handlerRuns(mEcho))

	// The running handler finishes and its answer is delivered.
	close(e.block.release)
	require.NoError(t, <-first)
	assert.Equal(t, "first", string(firstResp))
	require.NoError(t, <-shut)
	assert.ErrorIs(t, <-e.serveErr, ErrClosed)

	_, err = c.Call(context.Background(), e.addr, mEcho, nil)
	assert.ErrorIs(t, err, ErrUnavailable)
	require.NoError(t, c.Close())
	require.NoError(t, e.srv.Close())
	leak()
}

func TestShutdownContextExpires(t *testing.T) {
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{})
	errc := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), e.addr, mBlock, nil)
		errc <- err
	}()
	<-e.block.started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, e.srv.Shutdown(ctx), context.DeadlineExceeded)
	// Close cancels the handler and joins it.
	require.NoError(t, e.srv.Close())
	require.NoError(t, e.srv.Close())
	assert.ErrorIs(t, <-errc, ErrConnClosed)
}

func TestCloseIdempotentAndFailsInFlight(t *testing.T) {
	leak := checkGoroutines(t)
	e := newEnv(t, ServerConfig{})
	c := e.client(t, ClientConfig{})
	errc := make(chan error, 1)
	go func() {
		_, err := c.Call(context.Background(), e.addr, mBlock, nil)
		errc <- err
	}()
	<-e.block.started
	require.NoError(t, c.Close())
	err := <-errc
	assert.ErrorIs(t, err, ErrConnClosed)
	assert.ErrorIs(t, err, ErrClosed)
	require.NoError(t, c.Close())
	_, err = c.Call(context.Background(), e.addr, mEcho, nil)
	assert.ErrorIs(t, err, ErrClosed)
	require.NoError(t, e.srv.Close())
	require.NoError(t, e.srv.Close())
	assert.ErrorIs(t, e.srv.Serve(nopListener{}), ErrClosed)
	leak()
}

func TestServeAfterShutdown(t *testing.T) {
	srv, err := NewServer(ServerConfig{Secret: testSecret})
	require.NoError(t, err)
	require.NoError(t, srv.Shutdown(context.Background()))
	assert.ErrorIs(t, srv.Serve(nopListener{}), ErrClosed)
	require.NoError(t, srv.Close())
}

func TestBuffer(t *testing.T) {
	b := Buffer{pool: &wire.Pool{}}
	copy(b.Extend(3), "abc")
	_, _ = b.Write([]byte("def"))
	big := b.Extend(5000)
	for i := range big {
		big[i] = 'x'
	}
	assert.Equal(t, 5006, b.Len())
	assert.Equal(t, "abcdef", string(b.Bytes()[:6]))
	assert.Empty(t, b.Extend(-1))
	b.Truncate(4)
	assert.Equal(t, "abcd", string(b.Bytes()))
	b.Truncate(10) // longer than the response: nothing changes
	copy(b.Extend(1), "z")
	assert.Equal(t, "abcdz", string(b.Bytes()))
	b.Reset()
	assert.Zero(t, b.Len())
	b.release()
	assert.Nil(t, b.Bytes())
}
