package transport

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTCPLoopback(t *testing.T) {
	var tr TCP
	l, err := tr.Listen("127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c)
		done <- err
	}()
	c, err := tr.Dial(context.Background(), l.Addr().String())
	require.NoError(t, err)
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(buf))
	require.NoError(t, c.Close())
	require.NoError(t, <-done)
}

func TestTCPDialCancelled(t *testing.T) {
	var tr TCP
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := tr.Dial(ctx, "127.0.0.1:1")
	assert.ErrorIs(t, err, context.Canceled)
}
