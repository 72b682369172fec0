package ps

import (
	"errors"
	"testing"

	"github.com/elasticps/elasticps/embedding"
	"github.com/stretchr/testify/require"
)

// FuzzDecodeApplied: any input decodes or is refused with ErrCorruptApplied, never panics, and
// what decodes loads and saves again as the same state.
func FuzzDecodeApplied(f *testing.F) {
	s, err := NewServer(ServerConfig{ID: "ps-0", Secret: []byte("a secret of the fence fuzz test."), Slots: 64, Tables: []TableSpec{{Name: "emb", Config: embedding.Config{Dim: 4}}}})
	require.NoError(f, err)
	a := s.appliedLocked("emb")
	k := DataShard{Epoch: 1, Shard: 2}
	a.stripes[a.stripe(k)].m[k] = &AppliedShard{Through: 64, Batches: []AppliedBatch{{Start: 64, End: 128, Slots: []uint32{3, 9, 40}}, {Start: 192, End: 200, Slots: []uint32{1}}}}
	k2 := DataShard{Epoch: 1, Shard: 7}
	a.stripes[a.stripe(k2)].m[k2] = &AppliedShard{Through: 512}
	f.Add(s.AppliedState(nil))
	f.Add([]byte(appliedMagic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeApplied(b)
		if err != nil {
			require.True(t, errors.Is(err, ErrCorruptApplied), "%v", err)
			return
		}
		s2, err := NewServer(ServerConfig{ID: "ps-0", Secret: []byte("a secret of the fence fuzz test."), Slots: 64})
		require.NoError(t, err)
		require.NoError(t, s2.LoadApplied([][]byte{b}, nil))
		again, err := decodeApplied(s2.AppliedState(nil))
		require.NoError(t, err)
		for name, shards := range m {
			if len(shards) == 0 {
				delete(m, name) // a table with nothing recorded is not saved
			}
		}
		require.Equal(t, m, again)
	})
}
