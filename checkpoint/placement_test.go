package checkpoint_test

import (
	"testing"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
	"github.com/stretchr/testify/require"
)

// The checkpoint package places rows as every other package does (embedding.Slot), though it
// does not import it: a row is saved by, and restored onto, the server that owns its slot.
func TestPlacementAgreesWithEmbeddingSlot(t *testing.T) {
	for _, slots := range []int{1, 7, 64, 4096, 1 << 20} {
		for id := uint64(0); id < 5000; id++ {
			x := id * 0x9e3779b97f4a7c15
			require.Equal(t, embedding.Slot(x, slots), checkpoint.SlotOfForTest(x, slots), "id %d, %d slots", x, slots)
		}
	}
}
