package elastic

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files of the trace tests")

// TestCoreTraces runs every testdata/*.trace script against a fresh core and compares what it
// prints with testdata/*.golden (go test -run TestCoreTraces -rewrite updates them).
//
// Script lines (# starts a comment):
//
//	every N | interval D                       checkpoint schedule (before the first event)
//	arrive-timeout D | silence D               timings (before the first event)
//	time +D                                    advance the clock
//	join W | leave W | fail W REASON           membership
//	gossipfail W QUIET                         gossip declared W failed
//	begin W [eEPOCH] | end W ok|fail [eEPOCH]  a batch (default epoch: the member's)
//	arrive W [gGEN] [eEPOCH]                   arrive at the barrier (default: the current one)
//	request | timers | stop                    ask for a checkpoint, run the timers, stop
//	snapdone [ERR] | commitdone STEP [ERR]     outcomes reported by the driver
//	restart                                    a new core restored from the last commit
func TestCoreTraces(t *testing.T) {
	scripts, err := filepath.Glob("testdata/*.trace")
	require.NoError(t, err)
	require.NotEmpty(t, scripts)
	for _, path := range scripts {
		name := strings.TrimSuffix(filepath.Base(path), ".trace")
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(path)
			require.NoError(t, err)
			got := runTrace(t, string(src))
			golden := strings.TrimSuffix(path, ".trace") + ".golden"
			if *rewrite {
				require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
				return
			}
			want, err := os.ReadFile(golden)
			require.NoError(t, err, "run with -rewrite to create it")
			require.Equal(t, string(want), got)
		})
	}
}

func runTrace(t *testing.T, src string) string {
	now := time.Unix(1_700_000_000, 0)
	cfg := coreConfig{}
	var c *core
	var out strings.Builder
	var lastCommitted, lastIncarnation uint64
	get := func() *core {
		if c == nil {
			c = newCore(cfg, now)
		}
		return c
	}
	epochOf := func(w string, args []string) uint64 {
		for _, a := range args {
			if strings.HasPrefix(a, "e") {
				inc, n, ok := strings.Cut(a[1:], ".")
				require.True(t, ok, "epoch %q is INCARNATION.N", a)
				i, err := strconv.ParseUint(inc, 10, 64)
				require.NoError(t, err)
				k, err := strconv.ParseUint(n, 10, 64)
				require.NoError(t, err)
				return i<<32 | k
			}
		}
		if m := get().members[w]; m != nil {
			return m.epoch
		}
		return 0
	}
	for n, line := range strings.Split(src, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			if line != "" {
				fmt.Fprintln(&out, line)
			}
			continue
		}
		f := strings.Fields(line)
		fmt.Fprintf(&out, "> %s\n", line)
		var acts []action
		config := false
		arg := func(i int) string {
			require.Greater(t, len(f), i, "line %d: %q needs %d arguments", n+1, line, i)
			return f[i]
		}
		switch f[0] {
		case "every":
			config = true
			require.Nil(t, c, "line %d: configure before the first event", n+1)
			v, err := strconv.ParseUint(arg(1), 10, 64)
			require.NoError(t, err)
			cfg.every = v
		case "interval":
			config = true
			require.Nil(t, c, "line %d: configure before the first event", n+1)
			d, err := time.ParseDuration(arg(1))
			require.NoError(t, err)
			cfg.interval = d
		case "arrive-timeout", "silence":
			config = true
			require.Nil(t, c, "line %d: configure before the first event", n+1)
			d, err := time.ParseDuration(arg(1))
			require.NoError(t, err)
			if f[0] == "silence" {
				cfg.silence = d
			} else {
				cfg.arriveTimeout = d
			}
		case "time":
			d, err := time.ParseDuration(strings.TrimPrefix(arg(1), "+"))
			require.NoError(t, err)
			now = now.Add(d)
			get().tick(now)
		case "join":
			var e uint64
			e, acts = get().join(now, arg(1))
			fmt.Fprintf(&out, "epoch %s\n", epochString(e))
		case "leave":
			acts = get().leave(now, arg(1), epochOf(arg(1), f[2:]))
		case "fail":
			acts = get().fail(now, arg(1), strings.Join(f[2:], " "))
		case "gossipfail":
			// gossipfail W QUIET: gossip declared W failed; it is failed if silent for QUIET.
			d, err := time.ParseDuration(arg(2))
			require.NoError(t, err)
			acts = get().gossipFailed(now, arg(1), d)
		case "begin":
			fmt.Fprintf(&out, "begin %v\n", get().begin(now, arg(1), epochOf(arg(1), f[2:])))
		case "end":
			_, acts = get().end(now, arg(1), epochOf(arg(1), f[3:]), arg(2) == "ok")
		case "arrive":
			gen := get().gen
			for _, a := range f[2:] {
				if strings.HasPrefix(a, "g") {
					g, err := strconv.ParseUint(a[1:], 10, 64)
					require.NoError(t, err)
					gen = g
				}
			}
			acts = get().arrive(now, arg(1), epochOf(arg(1), f[2:]), gen)
		case "request":
			acts = get().request(now, false)
		case "final":
			acts = get().request(now, true)
		case "timers":
			acts = get().timers(now)
		case "stop":
			get().stop()
		case "snapdone":
			var err error
			if len(f) > 1 {
				err = errors.New(strings.Join(f[1:], " "))
			}
			acts = get().snapshotDone(now, get().gen, err)
		case "commitdone":
			step, err := strconv.ParseUint(arg(1), 10, 64)
			require.NoError(t, err)
			var cerr error
			if len(f) > 2 {
				cerr = errors.New(strings.Join(f[2:], " "))
			}
			get().commitDone(step, cerr)
			if cerr == nil {
				lastCommitted, lastIncarnation = step, get().incarnation
			}
		case "serverfail":
			// serverfail ID hold|go: a parameter server failed (hold: Rollback).
			acts = get().serverFailed(now, arg(1), "test", arg(2) == "hold")
		case "rollback":
			// The driver's rollback: the newest commit, as the next incarnation.
			get().restore(lastCommitted, lastCommitted, get().incarnation+1)
		case "recovered":
			acts = get().recovered(now)
		case "restart":
			// What a commit records: its step and the committing coordinator's incarnation.
			c = newCore(cfg, now)
			c.restore(lastCommitted, lastCommitted, max(lastIncarnation, c.incarnation)+1)
		default:
			t.Fatalf("line %d: unknown command %q", n+1, line)
		}
		if config {
			continue
		}
		for _, a := range acts {
			fmt.Fprintf(&out, "  %s\n", a)
		}
		fmt.Fprintf(&out, "  [%s]\n", get())
	}
	return out.String()
}

// A negative checkpoint interval is a bad config; a positive one is not.
func TestConfigCheckpointInterval(t *testing.T) {
	type unused struct{ ParameterServer } // Validate calls no method
	cfg := Config{Job: "j", Servers: []ParameterServer{unused{}}}
	require.NoError(t, cfg.Validate())
	cfg.CheckpointInterval = 10 * time.Second
	require.NoError(t, cfg.Validate())
	cfg.CheckpointInterval = -time.Second
	require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig)
}
