package autoscale_test

import (
	"net"
	"testing"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/autoscale"
	"github.com/elasticps/elasticps/elastic/remote"
	"github.com/elasticps/elasticps/shard/shardnet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Runner drives a coordinator in this process or one in another through its client.
var (
	_ autoscale.Job = (*elastic.Coordinator)(nil)
	_ autoscale.Job = (*remote.Control)(nil)
)

// serveControl serves the control protocol of l's coordinator on a loopback TCP port, as a
// coordinator's process does, and returns a client of it.
func serveControl(t *testing.T, l *live) *remote.Control {
	t.Helper()
	srv, err := shardnet.NewServer(shardnet.ServerConfig{Service: l.c.Service(), Secret: l.job.Secret()})
	require.NoError(t, err)
	require.NoError(t, remote.ServeControl(srv, l.c))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	ctl, err := remote.NewControl(remote.Config{Addr: ln.Addr().String(), Secret: l.job.Secret()})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctl.Close()
		srv.Close()
		assert.NoError(t, <-served)
	})
	return ctl
}

// The hot-server scenario with the runner in another process: the servers' counters reach it
// through Usage, and its SetPlan and Rebalance reach the coordinator.
func TestRemoteHotServerAddsServerAndMovesSlots(t *testing.T) {
	l := startLive(t)
	hotServerAddsServer(t, l, serveControl(t, l))
}

// A straggler is replaced through the remote coordinator's Fail when the runner has no
// ReplaceWorker of its own.
func TestRemoteReplaceWorkerFailsIt(t *testing.T) {
	l := startLive(t)
	replaceWorkerFailsIt(t, l, serveControl(t, l))
}
