package elastic_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A replacement restores its slots from shared memory only where that memory holds its
// predecessor's sealed snapshot of the commit: on the predecessor's host. Another host's region
// of the same job and node (left there by an earlier process of the node, sealed at the same
// step but never committed) is not trusted, although its job, node and step match: the commit
// record names each node's shared-memory segments by ids random to the process that wrote them,
// and a region is used only when it holds exactly those. Each host is a shared-memory directory
// of its own, as /dev/shm is.
func TestReplacementUsesSharedMemoryOnlyOnItsPredecessorsHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		host string // of the replacement
		want checkpoint.Source
	}{
		{"same host", "a", checkpoint.SourceShm},
		{"another host", "b", checkpoint.SourceStorage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hosts := map[string]string{"a": filepath.Join(t.TempDir(), "a"), "b": filepath.Join(t.TempDir(), "b")}
			store := checkpoint.NewMemStorage()
			recovered := make(chan elastic.RecoveryEvent, 4)
			j := startFaultJobWith(t, 3, store, hosts["a"], func(c *elastic.Config) {
				c.OnRecovery = func(ev elastic.RecoveryEvent) { recovered <- ev }
				c.Recovery = elastic.Rollback
				c.HealthEvery = 20 * time.Millisecond
				c.ServerTimeout = 200 * time.Millisecond
				c.ReplaceWait = time.Minute
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			require.NoError(t, j.worker("w0").run(ctx, trainStep))
			step, err := j.coord.Checkpoint(ctx)
			require.NoError(t, err)
			table, err := j.coord.OwnerTable(ctx, 0)
			require.NoError(t, err)

			// Host b holds a region of ps-1 sealed at the same step by another process, with
			// other rows (none), persisted elsewhere and never committed.
			stale, err := ps.NewServer(ps.ServerConfig{ID: "ps-1", Secret: j.secret, Slots: faultSlots, Tables: []ps.TableSpec{faultTable}})
			require.NoError(t, err)
			defer stale.Close()
			_, err = stale.SetOwnerTable(table)
			require.NoError(t, err)
			ls, err := server.New(stale, "elsewhere:1", checkpoint.Config{Job: "faults", Storage: checkpoint.NewMemStorage(), ShmDir: hosts["b"], FullEvery: 3})
			require.NoError(t, err)
			_, err = ls.Snapshot(ctx, step, elastic.Progress{}, elastic.Progress{})
			require.NoError(t, err)
			_, err = ls.WaitPersisted(ctx, step)
			require.NoError(t, err)
			require.NoError(t, ls.Close())

			// ps-1 dies; a new incarnation comes up on tc.host.
			j.kill(1)
			rep, err := j.restartOn(1, hosts[tc.host])
			require.NoError(t, err)
			var ev elastic.RecoveryEvent
			select {
			case ev = <-recovered:
			case <-ctx.Done():
				t.Fatal("no recovery")
			}
			require.NoError(t, ev.Err)
			require.Equal(t, step, ev.Step)
			res := rep.Restored()
			require.NotNil(t, res, "the replacement restored its slots")
			assert.Equal(t, tc.want, res.Sources["ps-1"], "where ps-1's part came from")
			assert.Equal(t, faultExpected(), serverRows(j.liveServers()), "every row as trained")
		})
	}
}

// restartOn starts a new incarnation of server i with the shared-memory directory shm (its
// host's) and hands it to the coordinator.
func (j *faultJob) restartOn(i int, shm string) (*server.Server, error) {
	id := j.servers[i].ID()
	j.net.Restart(id)
	srv, err := ps.NewServer(ps.ServerConfig{ID: id, Secret: j.secret, Slots: faultSlots, Tables: []ps.TableSpec{faultTable}, Transport: j.net.Host(id)})
	if err != nil {
		return nil, err
	}
	l, err := j.net.Host(id).Listen(id + ":1")
	if err != nil {
		return nil, err
	}
	ls, err := server.New(srv, l.Addr().String(), checkpoint.Config{Job: "faults", Storage: j.store, ShmDir: shm, FullEvery: 3})
	if err != nil {
		return nil, fmt.Errorf("restart %s: %w", id, err)
	}
	j.serve(func() { srv.Serve(l) })
	j.mu.Lock()
	j.servers[i], j.locals[i] = srv, ls
	delete(j.dead, i)
	j.mu.Unlock()
	return ls, j.coord.ReplaceServer(ls)
}
