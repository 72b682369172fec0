package elastic

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWireRoundTrips(t *testing.T) {
	w := workerMsg{worker: "worker-7", epoch: 3<<32 | 9, ok: true}
	got, err := decodeWorkerMsg(w.append(nil))
	require.NoError(t, err)
	assert.Equal(t, w, got)

	s := serverMsg{step: 77, floor: 2 << 32, epochs: []uint64{1<<32 | 1, 1<<32 | 4}, table: []byte("table bytes")}
	gs, err := decodeServerMsg(s.append(nil))
	require.NoError(t, err)
	assert.Equal(t, s, gs)

	// Every truncation and a trailing byte are refused.
	for _, b := range [][]byte{w.append(nil), s.append(nil)} {
		for n := range len(b) {
			_, e1 := decodeWorkerMsg(b[:n])
			_, e2 := decodeServerMsg(b[:n])
			assert.ErrorIs(t, e1, errMalformed)
			assert.ErrorIs(t, e2, errMalformed)
		}
	}
	_, err = decodeWorkerMsg(append(w.append(nil), 0))
	assert.ErrorIs(t, err, errMalformed)
}

func FuzzDecodeWorkerMsg(f *testing.F) {
	f.Add(workerMsg{worker: "w", epoch: 1, ok: true}.append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeWorkerMsg(b)
		if err != nil {
			assert.ErrorIs(t, err, errMalformed)
			return
		}
		again, err := decodeWorkerMsg(m.append(nil))
		require.NoError(t, err)
		assert.Equal(t, m, again)
	})
}

func FuzzDecodeServerMsg(f *testing.F) {
	f.Add(serverMsg{step: 1, floor: 2, epochs: []uint64{3}, table: []byte{4}}.append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeServerMsg(b)
		if err != nil {
			assert.ErrorIs(t, err, errMalformed)
			return
		}
		again, err := decodeServerMsg(m.append(nil))
		require.NoError(t, err)
		assert.Equal(t, m.step, again.step)
		assert.Equal(t, len(m.epochs), len(again.epochs))
	})
}
