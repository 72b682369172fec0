package ps

import (
	"math/rand/v2"
	"testing"

	"github.com/elasticps/elasticps/embedding"
	"github.com/stretchr/testify/require"
)

// The inlined slot hash must place every id exactly where embedding.Slot does.
func TestSlotOfMatchesEmbeddingSlot(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	ids := []uint64{0, 1, 2, 1 << 63, ^uint64(0), 0x9e3779b97f4a7c15}
	for len(ids) < 20000 {
		ids = append(ids, rng.Uint64(), uint64(rng.IntN(1<<20)))
	}
	for _, slots := range []int{1, 2, 3, 7, 1000, 4096, 65536, 1<<20 + 1} {
		for _, id := range ids {
			require.Equal(t, embedding.Slot(id, slots), slotOf(id, slots), "id %d, %d slots", id, slots)
		}
	}
}
