package local_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/local"
	"github.com/elasticps/elasticps/embedding"
	"github.com/elasticps/elasticps/ps"
	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// syncBuffer is a buffer the job's goroutines write to at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Split(bytes.TrimSpace(s.b.Bytes()), []byte("\n"))
}

// Every record a job logs names the job, and the role and node id of its maker: a job that
// trains, checkpoints and restarts a server logs records of the coordinator, of its servers
// and of its worker, each with those three attributes once.
func TestEveryRecordNamesJobRoleAndNode(t *testing.T) {
	var out syncBuffer
	logger := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	recovered := make(chan struct{}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job, err := local.Start(ctx, local.Config{Job: "logs", Servers: 2, Slots: 16,
		Tables: []ps.TableSpec{{Name: "emb", Config: embedding.Config{Dim: 2}}},
		Coordinator: elastic.Config{Logger: logger, Storage: checkpoint.NewMemStorage(),
			OnRecovery: func(elastic.RecoveryEvent) { recovered <- struct{}{} },
			Dispatcher: shard.Config{Dataset: shard.IndexedDataset(endless), ShardSize: 1 << 20}},
		Checkpoint: checkpoint.Config{ShmDir: t.TempDir()}})
	require.NoError(t, err)
	defer job.Close()
	sess, err := job.NewSession("w-0", shard.ReaderConfig{Source: endlessData, BatchSize: 64})
	require.NoError(t, err)
	for range 5 {
		require.NoError(t, sess.Step(ctx, func(ctx context.Context, b *elastic.Batch) error {
			ids := make([]uint64, 0, b.Len())
			for i := range b.Len() {
				ids = append(ids, b.Field(i, 0)...)
			}
			return b.Push(ctx, "emb", ids, make([]float32, 2*len(ids)))
		}))
	}
	_, err = job.Coordinator().Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, job.RestartServerByID(ctx, "ps-1", "a test restarts it"))
	select {
	case <-recovered:
	case <-ctx.Done():
		t.Fatal("no recovery after the restart")
	}
	// A client with the wrong secret is refused, which the server logs.
	intruder, err := ps.NewClient(ps.ClientConfig{Secret: []byte("not the cluster secret, 32 bytes"), Servers: []string{job.Servers[0].Node().Addr}, Retries: 1})
	require.NoError(t, err)
	require.Error(t, intruder.Pull(ctx, "emb", []uint64{1}, make([]float32, 2)))
	intruder.Close()
	require.NoError(t, sess.Close())
	require.NoError(t, job.Close())

	roles := map[string]bool{}
	for _, line := range out.lines() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(line, &rec), "%s", line)
		assert.Equal(t, "logs", rec["job"], "%s", line)
		assert.NotEmpty(t, rec["node"], "%s", line)
		role, _ := rec["role"].(string)
		require.Contains(t, []string{"coordinator", "ps", "worker"}, role, "%s", line)
		roles[role] = true
		for _, key := range []string{`"job"`, `"role"`, `"node"`} {
			assert.Equal(t, 1, bytes.Count(line, []byte(key+":")), "%s once in %s", key, line)
		}
	}
	assert.Equal(t, map[string]bool{"coordinator": true, "ps": true, "worker": true}, roles)
}
