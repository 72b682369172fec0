package elastictest

import (
	"time"

	"github.com/elasticps/elasticps/shard/shardtest"
)

// Clock is a fake wall clock for elastic.Config.Now (and shard.Config.Clock): it reads the time
// it was set to and moves only when told to (Advance). Safe for concurrent use. It is the
// shard package's test clock, so that one clock can drive a coordinator and its dispatcher.
type Clock = shardtest.Clock

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return shardtest.NewClock(start) }
