package memnet

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// connect returns both ends of a connection from host a to a listener on b.
func connect(t *testing.T, n *Network, a, b string) (client, server net.Conn) {
	t.Helper()
	l, err := n.Host(b).Listen(b + ":0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	client, err = n.Host(a).Dial(context.Background(), l.Addr().String())
	require.NoError(t, err)
	server, err = l.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

func readTimeout(c net.Conn, n int, d time.Duration) ([]byte, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	b := make([]byte, n)
	_, err := io.ReadFull(c, b)
	return b, err
}

func TestEchoAndClose(t *testing.T) {
	n := New(Config{})
	c, s := connect(t, n, "a", "b")
	assert.Equal(t, "memnet", c.LocalAddr().Network())
	assert.Equal(t, s.LocalAddr().String(), c.RemoteAddr().String())
	assert.Equal(t, c.LocalAddr().String(), s.RemoteAddr().String())

	_, err := c.Write([]byte("hello "))
	require.NoError(t, err)
	_, err = c.Write([]byte("world"))
	require.NoError(t, err)
	got, err := readTimeout(s, 11, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "hello world", string(got))

	_, err = s.Write([]byte("bye"))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	got, err = readTimeout(c, 3, 5*time.Second)
	require.NoError(t, err, "bytes written before Close are still delivered")
	assert.Equal(t, "bye", string(got))
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
	_, err = c.Write([]byte("x"))
	assert.ErrorIs(t, err, ErrBrokenPipe)
	_, err = s.Read(make([]byte, 1))
	assert.ErrorIs(t, err, net.ErrClosed)
	assert.ErrorIs(t, s.Close(), net.ErrClosed)
}

func TestCloseUnblocksRead(t *testing.T) {
	n := New(Config{})
	c, _ := connect(t, n, "a", "b")
	errc := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		errc <- err
	}()
	require.NoError(t, c.Close())
	assert.ErrorIs(t, <-errc, net.ErrClosed)
}

func TestDeadlines(t *testing.T) {
	n := New(Config{Window: 8})
	c, s := connect(t, n, "a", "b")
	_, err := readTimeout(s, 1, 10*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())

	// A write larger than the window blocks until its deadline.
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(10*time.Millisecond)))
	k, err := c.Write(make([]byte, 20))
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.Equal(t, 8, k)

	// A deadline in the past wakes a blocked reader.
	errc := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 100))
		errc <- err
		_, err = s.Read(make([]byte, 100))
		errc <- err
	}()
	assert.NoError(t, <-errc) // the 8 buffered bytes
	require.NoError(t, s.SetReadDeadline(time.Unix(1, 0)))
	assert.ErrorIs(t, <-errc, os.ErrDeadlineExceeded)
}

func TestWindowBackPressure(t *testing.T) {
	n := New(Config{Window: 1024})
	c, s := connect(t, n, "a", "b")
	payload := bytes.Repeat([]byte("0123456789"), 10000)
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		done <- err
	}()
	got, err := readTimeout(s, len(payload), 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, <-done)
	assert.True(t, bytes.Equal(payload, got))
}

func TestListenAddresses(t *testing.T) {
	n := New(Config{})
	h := n.Host("ps-0")
	l1, err := h.Listen("")
	require.NoError(t, err)
	l2, err := h.Listen("ps-0:0")
	require.NoError(t, err)
	assert.NotEqual(t, l1.Addr().String(), l2.Addr().String())
	_, err = n.Host("other").Listen(l1.Addr().String())
	assert.ErrorIs(t, err, ErrAddrInUse)
	_, err = h.Dial(context.Background(), "nowhere:1")
	assert.ErrorIs(t, err, ErrRefused)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = h.Dial(ctx, l1.Addr().String())
	assert.ErrorIs(t, err, context.Canceled)
	require.NoError(t, l1.Close())
	_, err = l1.Accept()
	assert.ErrorIs(t, err, net.ErrClosed)
	_, err = h.Dial(context.Background(), l1.Addr().String())
	assert.ErrorIs(t, err, ErrRefused)
	require.NoError(t, l2.Close())
}

func TestListenerCloseResetsUnaccepted(t *testing.T) {
	n := New(Config{})
	l, err := n.Host("b").Listen("b:1")
	require.NoError(t, err)
	c, err := n.Host("a").Dial(context.Background(), "b:1")
	require.NoError(t, err)
	require.NoError(t, l.Close())
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, ErrReset)
}

func TestPartitionHoldsThenDelivers(t *testing.T) {
	n := New(Config{})
	c, s := connect(t, n, "a", "b")
	n.Partition("a", "b")
	_, err := n.Host("a").Dial(context.Background(), s.LocalAddr().String())
	assert.ErrorIs(t, err, ErrUnreachable)
	_, err = n.Host("b").Dial(context.Background(), s.LocalAddr().String())
	assert.NoError(t, err, "a host reaches itself")

	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	_, err = s.Write([]byte("pong"))
	require.NoError(t, err)
	_, err = readTimeout(s, 4, 20*time.Millisecond)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	_, err = readTimeout(c, 4, 20*time.Millisecond)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)

	n.Heal("b", "a")
	got, err := readTimeout(s, 4, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(got))
	got, err = readTimeout(c, 4, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "pong", string(got))
}

func TestDropLosesAndResets(t *testing.T) {
	n := New(Config{})
	c, s := connect(t, n, "a", "b")
	quiet, quietS := connect(t, n, "a", "b")

	n.SetDrop("a", "b", true)
	k, err := c.Write([]byte("lost"))
	require.NoError(t, err)
	assert.Equal(t, 4, k)
	_, err = readTimeout(s, 1, 20*time.Millisecond)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)

	// The other direction still works.
	_, err = s.Write([]byte("back"))
	require.NoError(t, err)
	got, err := readTimeout(c, 4, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "back", string(got))

	n.SetDrop("a", "b", false)
	_, err = s.Read(make([]byte, 1))
	assert.ErrorIs(t, err, ErrReset)
	_, err = c.Write([]byte("x"))
	assert.ErrorIs(t, err, ErrReset)

	// A connection that lost nothing goes on.
	_, err = quiet.Write([]byte("ok"))
	require.NoError(t, err)
	got, err = readTimeout(quietS, 2, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "ok", string(got))
}

func TestDelay(t *testing.T) {
	n := New(Config{})
	c, s := connect(t, n, "a", "b")
	const d = 50 * time.Millisecond
	n.SetDelay("a", "b", d)
	start := time.Now()
	_, err := c.Write([]byte("late"))
	require.NoError(t, err)
	got, err := readTimeout(s, 4, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "late", string(got))
	assert.GreaterOrEqual(t, time.Since(start), d)

	n.SetDelay("a", "b", 0)
	_, err = c.Write([]byte("now!"))
	require.NoError(t, err)
	got, err = readTimeout(s, 4, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "now!", string(got))
}

func TestKillAndRestart(t *testing.T) {
	n := New(Config{})
	l, err := n.Host("b").Listen("b:1")
	require.NoError(t, err)
	c, err := n.Host("a").Dial(context.Background(), "b:1")
	require.NoError(t, err)
	s, err := l.Accept()
	require.NoError(t, err)

	readErr := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		readErr <- err
	}()
	acceptErr := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		acceptErr <- err
	}()
	n.Kill("b")
	assert.ErrorIs(t, <-readErr, ErrReset)
	assert.ErrorIs(t, <-acceptErr, net.ErrClosed)
	_, err = s.Write([]byte("x"))
	assert.ErrorIs(t, err, net.ErrClosed)
	_, err = c.Write([]byte("x"))
	assert.ErrorIs(t, err, ErrReset)

	_, err = n.Host("a").Dial(context.Background(), "b:1")
	assert.ErrorIs(t, err, ErrRefused)
	_, err = n.Host("b").Listen("b:1")
	assert.ErrorIs(t, err, ErrHostDown)
	_, err = n.Host("b").Dial(context.Background(), "a:1")
	assert.ErrorIs(t, err, ErrHostDown)

	n.Restart("b")
	l, err = n.Host("b").Listen("b:1")
	require.NoError(t, err)
	defer l.Close()
	_, err = n.Host("a").Dial(context.Background(), "b:1")
	require.NoError(t, err)
}

func TestHealAll(t *testing.T) {
	n := New(Config{})
	c, s := connect(t, n, "a", "b")
	n.Partition("a", "b")
	n.SetDelay("b", "a", time.Hour)
	n.SetDrop("a", "c", true)
	n.HealAll()
	_, err := c.Write([]byte("ok"))
	require.NoError(t, err)
	_, err = readTimeout(s, 2, 5*time.Second)
	require.NoError(t, err)
	_, err = s.Write([]byte("ok"))
	require.NoError(t, err)
	_, err = readTimeout(c, 2, 5*time.Second)
	require.NoError(t, err)
}

func TestConcurrentTraffic(t *testing.T) {
	n := New(Config{Window: 4096})
	c, s := connect(t, n, "a", "b")
	const writers, each = 8, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if _, err := c.Write([]byte{byte(w)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	got, err := readTimeout(s, writers*each, 10*time.Second)
	require.NoError(t, err)
	wg.Wait()
	counts := map[byte]int{}
	for _, b := range got {
		counts[b]++
	}
	for w := range writers {
		assert.Equal(t, each, counts[byte(w)])
	}
	// Faults flipping during traffic must not race.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			n.SetDelay("a", "b", time.Microsecond)
			n.SetDelay("a", "b", 0)
		}
	}()
	for range 50 {
		_, err := c.Write([]byte("z"))
		require.NoError(t, err)
		_, err = readTimeout(s, 1, 5*time.Second)
		require.NoError(t, err)
	}
	<-done
}
