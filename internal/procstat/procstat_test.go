package procstat

import (
	"os"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadSeesWorkAndMemory burns CPU and touches memory, and checks that both show.
func TestReadSeesWorkAndMemory(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("resident memory is read from /proc")
	}
	before := Read()
	require.Equal(t, os.Getpid(), before.Pid)
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	x := 0
	for i := 0; i < 50_000_000; i++ {
		x += i ^ (x >> 3)
	}
	after := Read()
	runtime.KeepAlive(buf)
	assert.Greater(t, after.CPU, before.CPU, "CPU time grows with work (%d)", x)
	assert.GreaterOrEqual(t, after.ResidentBytes, int64(64<<20), "the 64 MiB touched are resident")
}
