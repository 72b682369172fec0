package ps

import (
	"errors"
	"testing"

	"github.com/elasticps/elasticps/embedding"
	"github.com/stretchr/testify/require"
)

// FuzzDecodeApplied: any input decodes or is refused with ErrCorruptApplied, never panics, and
// what decodes re-encodes to an equal state.
func FuzzDecodeApplied(f *testing.F) {
	s, err := NewServer(ServerConfig{ID: "ps-0", Secret: []byte("a secret of the fence fuzz test."), Slots: 64, Tables: []TableSpec{{Name: "emb", Config: embedding.Config{Dim: 4}}}})
	require.NoError(f, err)
	a := s.appliedLocked("emb")
	a.stripes[0].m[Position{Epoch: 1, Shard: 2, Start: 0, End: 64}] = []uint32{3, 9, 40}
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
		require.Equal(t, len(m), len(again))
		for name, entries := range m {
			require.Equal(t, len(entries), len(again[name]))
		}
	})
}
