package remote

import (
	"testing"
	"time"

	"github.com/elasticps/elasticps/elastic"

	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWireRoundTrips(t *testing.T) {
	w := workerMsg{worker: "worker-7", epoch: 3<<32 | 9, ok: true, batch: 512}
	got, err := decodeWorkerMsg(w.append(nil))
	require.NoError(t, err)
	assert.Equal(t, w, got)

	s := serverMsg{inc: 0xabc, coord: 7, mode: uint8(elastic.RestoreNew), step: 77, floor: 2 << 32, epochs: []uint64{1<<32 | 1, 1<<32 | 4}, table: []byte("table bytes"), done: []byte("progress"), acc: []byte("accepted")}
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
	f.Add(workerMsg{worker: "w", epoch: 1, ok: true, batch: 32}.append(nil))
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
	f.Add(serverMsg{inc: 9, mode: 1, step: 1, floor: 2, epochs: []uint64{3}, table: []byte{4}}.append(nil))
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

func TestProgressRoundTrips(t *testing.T) {
	p := elastic.Progress{Epoch: 3, Offsets: map[ps.DataShard]int64{{Epoch: 3, Shard: 7}: 512, {Epoch: 3, Shard: 9}: 64}}
	got, err := decodeProgress(progressBytes(p))
	require.NoError(t, err)
	assert.Equal(t, p, got)
	assert.True(t, p.Done(ps.Position{Epoch: 2, Shard: 1, Start: 0, End: 10}), "a finished epoch")
	assert.True(t, p.Done(ps.Position{Epoch: 3, Shard: 7, Start: 256, End: 512}))
	assert.False(t, p.Done(ps.Position{Epoch: 3, Shard: 7, Start: 512, End: 600}), "not accepted yet")
	assert.False(t, p.Done(ps.Position{Epoch: 3, Shard: 8, Start: 0, End: 1}), "a shard not reported")
	b := progressBytes(p)
	for n := range len(b) {
		_, err := decodeProgress(b[:n])
		assert.ErrorIs(t, err, errMalformed)
	}
}

func TestRebalanceRoundTrips(t *testing.T) {
	m := rebalanceMsg{over: 1.25, window: 300 * time.Millisecond, maxMoves: 4}
	got, err := decodeRebalanceMsg(m.append(nil))
	require.NoError(t, err)
	assert.Equal(t, m, got)

	moves := []ps.Move{{Slot: 3, From: "ps-0", To: "ps-2"}, {Slot: 60, From: "ps-1", To: ""}}
	ans := appendMoves(nil, moves)
	back, err := decodeMoves(ans)
	require.NoError(t, err)
	assert.Equal(t, moves, back)
	none, err := decodeMoves(appendMoves(nil, nil))
	require.NoError(t, err)
	assert.Nil(t, none)

	// Every truncation and a trailing byte are refused; so is a count of moves the answer
	// cannot hold, before anything is allocated for them.
	for n := range len(ans) {
		_, err := decodeMoves(ans[:n])
		assert.ErrorIs(t, err, errMalformed, "%d bytes", n)
	}
	_, err = decodeMoves(append(ans, 0))
	assert.ErrorIs(t, err, errMalformed)
	_, err = decodeMoves(enc(nil).u64(1 << 60))
	assert.ErrorIs(t, err, errMalformed)
	_, err = decodeRebalanceMsg(append(m.append(nil), 1, 0))
	assert.ErrorIs(t, err, errMalformed)
}

func FuzzDecodeMoves(f *testing.F) {
	f.Add(appendMoves(nil, []ps.Move{{Slot: 1, From: "a", To: "b"}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		moves, err := decodeMoves(b)
		if err != nil {
			assert.ErrorIs(t, err, errMalformed)
			return
		}
		again, err := decodeMoves(appendMoves(nil, moves))
		require.NoError(t, err)
		assert.Equal(t, moves, again)
	})
}

func FuzzDecodeRebalanceMsg(f *testing.F) {
	f.Add(rebalanceMsg{over: 1.2, window: time.Second, maxMoves: 3}.append(nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeRebalanceMsg(b)
		if err != nil {
			assert.ErrorIs(t, err, errMalformed)
			return
		}
		again, err := decodeRebalanceMsg(m.append(nil))
		require.NoError(t, err)
		assert.Equal(t, m.maxMoves, again.maxMoves)
		assert.Equal(t, m.window, again.window)
	})
}
