package shardnet

import (
	"context"
	"io"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
)

// A server of the protocol before the combined call (the three methods only): a Reader on a
// Client tries the combined call once, learns it is unsupported and makes two calls from then
// on; every record is still counted once.
func TestReaderAgainstServerWithoutCombinedCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := memnet.New(memnet.Config{})
		d, err := shard.New(shard.Config{Dataset: shard.IndexedDataset(1000), ShardSize: 100})
		require.NoError(t, err)
		ledger := shardtest.NewLedger()
		srv, err := NewServer(ServerConfig{Service: ledger.Wrap(d), Secret: testSecret})
		require.NoError(t, err)
		rpcServer(t, nw, "old", "old:1", map[uint16]rpc.Handler{
			methodAcquire: srv.handleAcquire, methodReport: srv.handleReport, methodLeave: srv.handleLeave,
		})
		cli, err := NewClient(ClientConfig{Addr: "old:1", Secret: testSecret, Transport: nw.Host("w")})
		require.NoError(t, err)
		defer cli.Close()
		r, err := shard.NewReader(shard.ReaderConfig{Service: cli, Worker: "w", Source: shard.IndexedSource{Data: shard.IndexedFunc(1000, func(i int64, rec *shard.Record) error {
			rec.Label = float32(i)
			return nil
		})}, BatchSize: 50})
		require.NoError(t, err)
		defer r.Close()
		ctx := context.Background()
		n := 0
		for {
			b, err := r.Next(ctx)
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			n += b.Len()
			require.NoError(t, r.Done(ctx, b))
		}
		assert.Equal(t, 1000, n)
		p := d.Progress()
		require.NoError(t, ledger.Check(p))
		assert.True(t, p.Finished)
		st := r.Stats()
		assert.Equal(t, int64(0), st.Combined)
		assert.Equal(t, int64(0), st.Retries)
		assert.Equal(t, ServerStats{Acquires: 11, Reports: 20}, srv.Stats())
	})
}
