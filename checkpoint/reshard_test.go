package checkpoint

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ownedBy returns the slots s with s % n == i.
func ownedBy(slots, n, i int) []int {
	var out []int
	for s := range slots {
		if s%n == i {
			out = append(out, s)
		}
	}
	return out
}

// putOwned writes count rows of ids in slots owned by node i of n.
func putOwned(rng *rand.Rand, t *fakeTable, slots, n, i, count int, version uint64) {
	for added := 0; added < count; {
		id := rng.Uint64N(5000)
		if slotOf(id, slots)%n == i {
			t.put(id, version)
			added++
		}
	}
}

// threeNodeJob runs three nodes through several committed steps and returns the global state
// (rows by slot owner) at the last step.
func threeNodeJob(t *testing.T, cl *cluster) []map[uint64]string {
	ctx := context.Background()
	const n = 3
	rng := rand.New(rand.NewPCG(7, 7))
	var cks []*Checkpointer
	var tss [][]*fakeTable
	for i := range n {
		tabs, ts := tables2()
		for _, tb := range ts {
			putOwned(rng, tb, cl.slots, n, i, 300, 0)
			putOwned(rng, tb, cl.slots, n, (i+1)%n, 20, 999) // stale rows of slots another node owns
		}
		cks = append(cks, cl.open(cl.cfg(fmt.Sprintf("ps%d", i), tabs)))
		tss = append(tss, ts)
	}
	m := cl.committer()
	for step := uint64(10); step <= 50; step += 10 {
		var refs []ManifestRef
		for i := range n {
			for _, tb := range tss[i] {
				putOwned(rng, tb, cl.slots, n, i, 30, step)
				for range 3 {
					id := rng.Uint64N(5000)
					if slotOf(id, cl.slots)%n == i {
						tb.del(id)
					}
				}
			}
			_, ref := snap(t, cks[i], step, SnapshotSlots(ownedBy(cl.slots, n, i)),
				SnapshotBlob(fmt.Sprintf("dense%d", i), []byte{byte(i)}))
			refs = append(refs, ref)
		}
		_, err := m.Commit(ctx, step, refs)
		require.NoError(t, err)
	}
	global := make([]map[uint64]string, 2)
	for k := range global {
		global[k] = map[uint64]string{}
		for i := range n {
			for id, r := range filterState(tss[i][k].state(), cl.slots, func(s int) bool { return s%n == i }) {
				global[k][id] = r
			}
		}
	}
	for _, ck := range cks {
		require.NoError(t, ck.Close())
	}
	return global
}

func TestRestoreOntoOtherNodeCounts(t *testing.T) {
	cl := newCluster(t, NewMemStorage(), 64)
	global := threeNodeJob(t, cl)
	for _, m := range []int{2, 5, 1} {
		for _, fromStorage := range []bool{false, true} {
			t.Run(fmt.Sprintf("M=%d/storage=%v", m, fromStorage), func(t *testing.T) {
				union := []map[uint64]string{{}, {}}
				for j := range m {
					tabs, ts := tables2()
					ck := cl.open(cl.cfg(fmt.Sprintf("m%d-%d-%v", m, j, fromStorage), tabs))
					opts := []RestoreOption{RestoreSlots(ownedBy(cl.slots, m, j))}
					if fromStorage {
						opts = append(opts, RestoreFromStorage())
					}
					r, err := ck.Restore(context.Background(), opts...)
					require.NoError(t, err)
					assert.Equal(t, uint64(50), r.Step)
					for node, src := range r.Sources {
						want := SourceShm
						if fromStorage {
							want = SourceStorage
						}
						assert.Equal(t, want, src, "node %s", node)
					}
					assert.Len(t, r.Blobs, 3)
					for k, tb := range ts {
						want := filterState(global[k], cl.slots, func(s int) bool { return s%m == j })
						assert.Equal(t, want, tb.state(), "table %d of new node %d", k, j)
						for id, row := range tb.state() {
							union[k][id] = row
						}
					}
					require.NoError(t, ck.Close())
				}
				assert.Equal(t, global, union)
			})
		}
	}
}

func TestRestoreWithAnotherSlotCount(t *testing.T) {
	cl := newCluster(t, NewMemStorage(), 64)
	global := threeNodeJob(t, cl)
	cl.slots = 48 // the new job places rows by id with another slot count
	for _, fromStorage := range []bool{false, true} {
		union := []map[uint64]string{{}, {}}
		for j := range 2 {
			tabs, ts := tables2()
			ck := cl.open(cl.cfg(fmt.Sprintf("n%d-%v", j, fromStorage), tabs))
			opts := []RestoreOption{RestoreSlots(ownedBy(48, 2, j))}
			if fromStorage {
				opts = append(opts, RestoreFromStorage())
			}
			_, err := ck.Restore(context.Background(), opts...)
			require.NoError(t, err)
			for k, tb := range ts {
				assert.Equal(t, filterState(global[k], 48, func(s int) bool { return s%2 == j }), tb.state())
				for id, row := range tb.state() {
					union[k][id] = row
				}
			}
			require.NoError(t, ck.Close())
		}
		assert.Equal(t, global, union)
	}
}
