package train_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A coordinator role that a second coordinator takes the job over from ends at once with an
// error wrapping elastic.ErrSuperseded; it used to log that it stops and then run on, idle,
// until it was signalled.
func TestCoordinatorRoleEndsWhenTakenOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	base := smallConfig(t, 2000, 1)
	base.Duration = 0 // no deadline: only the takeover ends the first coordinator
	secret := []byte("a cluster secret shared by every process")
	nodes := []ps.Node{{ID: "ps-0", Addr: freeAddr(t)}}
	role := func(id, listen string) train.RoleConfig {
		return train.RoleConfig{Config: base, ID: id, Listen: listen, PS: nodes, Secret: secret}
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, stopServer := context.WithCancel(ctx)
	defer stopServer()
	wg.Go(func() { assert.NoError(t, train.RunServer(sctx, role("ps-0", nodes[0].Addr))) })

	started := make(chan struct{})
	first := role("coordinator", freeAddr(t))
	first.OnEvent = func(ev train.Event) {
		if ev.Kind == train.EventStart {
			close(started)
		}
	}
	firstDone := make(chan error, 1)
	go func() {
		sum, err := train.RunCoordinator(ctx, first)
		assert.True(t, sum == nil, "a coordinator taken over has no summary of the job to give")
		firstDone <- err
	}()
	select {
	case <-started:
	case err := <-firstDone:
		t.Fatalf("the first coordinator ended before it served: %v", err)
	}

	// The second one finds the server running the job and takes it over.
	sctx2, stopSecond := context.WithCancel(ctx)
	defer stopSecond()
	secondDone := make(chan error, 1)
	go func() {
		_, err := train.RunCoordinator(sctx2, role("coordinator", freeAddr(t)))
		secondDone <- err
	}()

	select {
	case err := <-firstDone:
		require.ErrorIs(t, err, elastic.ErrSuperseded)
	case <-time.After(30 * time.Second): // its health checks run every half second
		t.Fatal("the coordinator taken over did not end")
	case err := <-secondDone:
		t.Fatalf("the second coordinator ended first: %v", err)
	}
	stopSecond()
	<-secondDone
	stopServer()
}
