//go:build !unix

package procstat

import "time"

func cpuTime() time.Duration { return 0 }

func residentBytes() int64 { return 0 }
