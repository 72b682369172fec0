package train

import (
	"testing"
	"time"

	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
)

// The stop reason of a Duration cut counts positions: samples of indexed data, lines of text
// data (held-out and malformed lines are positions), with the samples trained beside.
func TestStoppedByDuration(t *testing.T) {
	pr := shard.Progress{EpochRecords: []shard.EpochProgress{{Epoch: 0, Records: 1000, Done: 1000}, {Epoch: 1, Records: 1000, Done: 250}}}
	cfg := &Config{Epochs: 3, Duration: time.Minute}
	assert.Equal(t, "stopped by -duration after 1250 of 3000 samples (3 epochs of 1000, -duration 1m0s)", stoppedByDuration(cfg, pr, 1250))
	cfg.Data.Kind = LibSVM
	assert.Equal(t, "stopped by -duration after 1250 of 3000 lines (3 epochs of 1000 lines, -duration 1m0s; 1000 samples trained: held-out and malformed lines are not)",
		stoppedByDuration(cfg, pr, 1000))
	assert.Equal(t, "stopped by -duration after 1250 of 3000 lines (3 epochs of 1000 lines, -duration 1m0s)", stoppedByDuration(cfg, pr, -1), "samples not known")
}

// Each kind of origin prints as the predictions file's first column.
func TestOriginsPrint(t *testing.T) {
	text := textOrigins(func(name string) string { return "/" + name })
	text.add("d/a.svm", 3)
	text.add("d/b.svm", 1)
	text.add("d/a.svm", 9)
	assert.Equal(t, []string{"/d/a.svm:3", "/d/b.svm:1", "/d/a.svm:9"}, []string{text.String(0), text.String(1), text.String(2)})
	assert.Equal(t, "1099511627777", indexOrigins("record", 1<<40, 2).String(1))
	assert.Equal(t, "ml/u1.test#41", ratingOrigins("ml/u1.test", []int{7, 41}).String(1))
}
