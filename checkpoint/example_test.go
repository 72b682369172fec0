package checkpoint_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sync"

	"github.com/elasticps/elasticps/checkpoint"
)

// rowTable is a minimal Table: id -> 16-byte record (id, mark, one float32 weight), with a change set.
type rowTable struct {
	mu      sync.Mutex
	rows    map[uint64][]byte
	changed map[uint64]bool
}

func newRowTable() *rowTable {
	return &rowTable{rows: map[uint64][]byte{}, changed: map[uint64]bool{}}
}

func (t *rowTable) set(id uint64, weight uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := make([]byte, 16)
	binary.LittleEndian.PutUint64(r, id)
	binary.LittleEndian.PutUint32(r[12:], weight)
	t.rows[id], t.changed[id] = r, true
}

func (t *rowTable) Schema() []byte  { return []byte("example/v1") }
func (t *rowTable) RawRowSize() int { return 16 }

func (t *rowTable) RawSize(changedOnly bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if changedOnly {
		return 16 * len(t.changed)
	}
	return 16 * len(t.rows)
}

func (t *rowTable) CopyRaw(dst []byte, changedOnly, newBase bool) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := slices.Sorted(maps.Keys(t.rows))
	if changedOnly {
		ids = slices.Sorted(maps.Keys(t.changed))
	}
	if 16*len(ids) > len(dst) {
		return 0, io.ErrShortBuffer
	}
	for i, id := range ids {
		rec := dst[16*i : 16*i+16]
		if r, ok := t.rows[id]; ok {
			copy(rec, r)
		} else {
			clear(rec)
			binary.LittleEndian.PutUint64(rec, id)
			binary.LittleEndian.PutUint32(rec[8:], checkpoint.DeletionMark)
		}
	}
	if newBase {
		clear(t.changed)
	}
	return 16 * len(ids), nil
}

func (t *rowTable) LoadRaw(src []byte, keep func(uint64) bool) (int, error) {
	if len(src)%16 != 0 {
		return 0, fmt.Errorf("%d bytes is not whole records", len(src))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for o := 0; o < len(src); o += 16 {
		id := binary.LittleEndian.Uint64(src[o:])
		if keep != nil && !keep(id) {
			continue
		}
		if binary.LittleEndian.Uint32(src[o+8:]) == checkpoint.DeletionMark {
			delete(t.rows, id)
		} else {
			t.rows[id] = append([]byte(nil), src[o:o+16]...)
		}
		n++
	}
	return n, nil
}

func Example() {
	ctx := context.Background()
	shm, _ := os.MkdirTemp("", "shm") // /dev/shm/elasticps by default
	defer os.RemoveAll(shm)
	store := checkpoint.NewMemStorage()

	// A parameter server with one table snapshots at steps 100 (full) and 200 (a delta).
	table := newRowTable()
	for id := range uint64(1000) {
		table.set(id, uint32(id))
	}
	ps, err := checkpoint.New(checkpoint.Config{Job: "ctr", Node: "ps-0", Storage: store, ShmDir: shm,
		Tables: map[string]checkpoint.Table{"user": table}})
	if err != nil {
		fmt.Println(err)
		return
	}
	committer, _ := checkpoint.NewCommitter(checkpoint.CommitterConfig{Job: "ctr", Storage: store})
	for _, step := range []uint64{100, 200} {
		table.set(step, 7) // training changes a row
		info, _ := ps.Snapshot(ctx, step, checkpoint.SnapshotBlob("dense", []byte{byte(step)}))
		ref, _ := ps.WaitPersisted(ctx, step)
		_, err := committer.Commit(ctx, step, []checkpoint.ManifestRef{ref}, checkpoint.Blob{Name: "dispatcher", Data: []byte("shard 3 @ 9000")})
		fmt.Printf("step %d: full %v, committed %v\n", step, info.Full, err == nil)
	}
	ps.Close()

	// A new server on the same host restores the newest commit. It finds ps-0's region sealed at the
	// committed step, so it reads the rows from shared memory rather than from storage.
	restored := newRowTable()
	ps2, _ := checkpoint.New(checkpoint.Config{Job: "ctr", Node: "ps-9", Storage: store, ShmDir: shm,
		Tables: map[string]checkpoint.Table{"user": restored}})
	defer ps2.Close()
	r, err := ps2.Restore(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	state, _ := committer.Blob(ctx, r.Step, "dispatcher")
	fmt.Printf("restored step %d from %v: %d rows, equal %v, dense %v, dispatcher %q\n", r.Step, r.Sources["ps-0"],
		len(restored.rows), maps.EqualFunc(table.rows, restored.rows, slices.Equal), r.Blobs[0].Data, state)
	// Output:
	// step 100: full true, committed true
	// step 200: full false, committed true
	// restored step 200 from shm: 1000 rows, equal true, dense [200], dispatcher "shard 3 @ 9000"
}
