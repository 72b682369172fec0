package train_test

import (
	"context"
	"net"
	"testing"

	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A parameter server says it serves (EventStart) only once its port is bound; one whose listen
// address is not its address in the server list is refused before it starts.
func TestServerAnnouncesOnceBoundAndChecksItsAddress(t *testing.T) {
	addr := freeAddr(t)
	rc := train.RoleConfig{Config: smallConfig(t, 2000, 1), ID: "ps-0", Listen: addr, PS: []ps.Node{{ID: "ps-0", Addr: addr}},
		Secret: []byte("a cluster secret shared by every process")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dialed := make(chan error, 1)
	rc.OnEvent = func(ev train.Event) {
		if ev.Kind != train.EventStart {
			return
		}
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		dialed <- err
		cancel()
	}
	require.NoError(t, train.RunServer(ctx, rc))
	select {
	case err := <-dialed:
		assert.NoError(t, err, "announced before its port was bound")
	default:
		t.Fatal("the server never said it serves")
	}

	other := freeAddr(t)
	rc.PS = []ps.Node{{ID: "ps-0", Addr: other}}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	started := false
	rc.OnEvent = func(ev train.Event) {
		if ev.Kind == train.EventStart {
			started = true
			cancel()
		}
	}
	err := train.RunServer(ctx, rc)
	require.ErrorIs(t, err, train.ErrConfig)
	assert.ErrorContains(t, err, other)
	assert.False(t, started)
}
