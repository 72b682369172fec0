package train_test

import (
	"strings"
	"testing"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/examples/dlrm/train"
	"github.com/stretchr/testify/assert"
)

// The summary never says a run trained exactly once without saying what its recoveries lost:
// lost updates show in the verdict and in a line of their own.
func TestSummarySaysWhatRecoveriesLost(t *testing.T) {
	epoch := elastic.EpochCheck{Epoch: 0, Records: 1000, Accepted: 1000, Covered: 1000, FirstDuplicate: -1, Complete: true}
	s := train.Summary{StopReason: "the epochs are done", Epochs: []train.EpochCheck{epoch}, ExactlyOnce: true}
	assert.Equal(t, "every position of every epoch covered exactly once", s.Verdict())
	assert.NotContains(t, s.String(), "recoveries:")

	s.Recoveries = 1
	assert.Contains(t, s.String(), "recoveries:  1 from parameter-server failures; nothing lost")
	s.Recoveries, s.LostRecords = 2, 170
	assert.Contains(t, s.Verdict(), "170 positions' updates were LOST")
	out := s.String()
	assert.Contains(t, out, "exactly once: every position covered exactly once, but 170 positions' updates were LOST")
	assert.Contains(t, out, "recoveries:  2 from parameter-server failures; 170 positions' updates lost on the restored slots (17.000% of the positions covered)")
	assert.False(t, strings.Contains(out, "every position of every epoch covered exactly once"), "no verdict without the loss")

	s.ExactlyOnce = false
	assert.Contains(t, s.Verdict(), "FAILED")
}
