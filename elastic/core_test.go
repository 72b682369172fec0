package elastic

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/elasticps/elasticps/ps"
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
//	hold | helddone                            ask for the model held still; the driver served it
//	snapdone [ERR] | commitdone STEP [ERR]     outcomes reported by the driver
//	restart                                    a new core restored from the last commit
//
// Parameter servers and their recovery:
//
//	servers ID... | slots N                    the job's servers and slot count (before the first event)
//	policy rollback|partial                    the recovery policy (before the first event)
//	server-timeout D | replace-wait D | probe-every D   server timings (before the first event)
//	health ID INC | health ID - [GOSSIP]       a health answer as incarnation INC, or none
//	suspect ID                                 a worker could not reach ID: probe it now?
//	serverfail ID [REASON]                     ID reported failed (or unfenceable, replaced)
//	step                                       the driver moves the recovery on (recoveryStep)
//	probed [ID@INC...]                         the same, with the answers to its probe (a new incarnation: a replacement)
//	restored [ERR]                             the restore the last plan asked for is done
//	rollback                                   the driver's rollback of the core, to the last commit
//	abandoned STEP                             may the snapshot of STEP not be committed?
//	move ID N                                  a live move publishes a table with N more slots on ID
//	void                                       a partial restore voids the batches in flight
//
// A restore prints the slots it moves, by old and new owner.
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
	var nodes []ps.Node
	var table *ps.OwnerTable
	var plan *restorePlan
	slots := 12
	get := func() *core {
		if c == nil {
			c = newCore(cfg, now)
			for _, n := range nodes {
				c.admitServer(now, n, 1)
			}
			if len(nodes) > 0 {
				var err error
				table, err = ps.NewOwnerTable(1, slots, nodes, nil)
				require.NoError(t, err)
			}
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
		case "hold":
			acts = get().requestHold(now)
		case "helddone":
			acts = get().holdDone(now, get().gen)
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
		case "servers", "slots", "policy", "server-timeout", "replace-wait", "probe-every":
			config = true
			require.Nil(t, c, "line %d: configure before the first event", n+1)
			switch f[0] {
			case "servers":
				for _, id := range f[1:] {
					nodes = append(nodes, ps.Node{ID: id, Addr: id + ":1"})
				}
			case "slots":
				v, err := strconv.Atoi(arg(1))
				require.NoError(t, err)
				slots = v
			case "policy":
				cfg.partial = arg(1) == "partial"
			default:
				d, err := time.ParseDuration(arg(1))
				require.NoError(t, err)
				*map[string]*time.Duration{"server-timeout": &cfg.serverTimeout, "replace-wait": &cfg.replaceWait, "probe-every": &cfg.probeEvery}[f[0]] = d
			}
		case "serverfail":
			reason := "test"
			if len(f) > 2 {
				reason = strings.Join(f[2:], " ")
			}
			acts = get().serverFailed(now, arg(1), reason)
		case "health":
			if arg(2) == "-" {
				acts = get().health(now, arg(1), 0, errors.New("no answer"), strings.Join(f[3:], " "))
				break
			}
			inc, err := strconv.ParseUint(arg(2), 10, 64)
			require.NoError(t, err)
			acts = get().health(now, arg(1), inc, nil, "")
		case "suspect":
			fmt.Fprintf(&out, "probe %v\n", get().suspect(now, arg(1)) != "")
		case "step":
			acts = get().recoveryStep(now, nil, table, nodes)
		case "probed":
			var answers []probeAnswer
			for _, a := range f[1:] {
				id, inc, ok := strings.Cut(a, "@")
				require.True(t, ok, "line %d: answers are ID@INC", n+1)
				i, err := strconv.ParseUint(inc, 10, 64)
				require.NoError(t, err)
				answers = append(answers, probeAnswer{node: ps.Node{ID: id, Addr: id + ":" + inc}, inc: i})
			}
			if answers == nil {
				answers = []probeAnswer{} // a probe that nobody answered
			}
			acts = get().recoveryStep(now, answers, table, nodes)
		case "restored":
			var rerr error
			if len(f) > 1 {
				rerr = errors.New(strings.Join(f[1:], " "))
			}
			require.NotNil(t, plan, "line %d: no restore was asked for", n+1)
			if rerr == nil && plan.table != nil {
				table, nodes = plan.table, plan.servers // what the driver makes the job's
			}
			acts, rerr = get().restoreDone(now, plan, rerr)
			if rerr != nil {
				fmt.Fprintf(&out, "error %v\n", rerr)
			}
		case "rollback":
			// The driver's rollback: the newest commit, as the next incarnation.
			get().restore(lastCommitted, lastCommitted, get().incarnation+1)
		case "void":
			// A partial restore publishes the restored slots: batches in flight are voided.
			var ids []string
			ids, acts = get().voidBatches(now)
			fmt.Fprintf(&out, "voided %v\n", ids)
		case "abandoned":
			step, err := strconv.ParseUint(arg(1), 10, 64)
			require.NoError(t, err)
			fmt.Fprintf(&out, "abandoned %v\n", get().commitAbandoned(step))
		case "move":
			// A live move's next table: only when no server is failed (resizeLocked).
			if ids := get().failedServers(); len(ids) > 0 {
				fmt.Fprintf(&out, "move refused: %v failed\n", ids)
				break
			}
			k, err := strconv.Atoi(arg(2))
			require.NoError(t, err)
			if !slices.ContainsFunc(nodes, func(n ps.Node) bool { return n.ID == arg(1) }) {
				nodes = append(nodes, ps.Node{ID: arg(1), Addr: arg(1) + ":1"})
				get().admitServer(now, nodes[len(nodes)-1], 1)
			}
			target, err := ps.NewOwnerTable(0, table.Slots, nodes, table)
			require.NoError(t, err)
			moves := table.Moves(target)
			next, err := table.WithMoves(table.Version+1, nodes, moves[:min(k, len(moves))])
			require.NoError(t, err)
			fmt.Fprintf(&out, "table %d: %s\n", next.Version, movesString(table, next))
			table = next
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
			if a.kind == actRestore {
				plan = a.plan
				if plan.table != nil {
					fmt.Fprintf(&out, "    moves: %s\n", movesString(table, plan.table))
				}
			}
		}
		fmt.Fprintf(&out, "  [%s]\n", get())
	}
	return out.String()
}

// movesString counts the slots that change owners from old to next, by old and new owner.
func movesString(old, next *ps.OwnerTable) string {
	count := map[string]int{}
	for _, m := range old.Moves(next) {
		count[m.From+"->"+m.To]++
	}
	if len(count) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(count)) {
		parts = append(parts, fmt.Sprintf("%s x%d", k, count[k]))
	}
	return strings.Join(parts, ", ")
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

// The trace's words for the core's state and actions.

func (p phase) String() string {
	return [...]string{"idle", "pausing", "snapshot", "held"}[p]
}

func (a action) String() string {
	switch a.kind {
	case actFence:
		return fmt.Sprintf("fence %s (%s)", epochsString(a.epochs), a.reason)
	case actEvict:
		return fmt.Sprintf("evict %s (%s)", a.worker, a.reason)
	case actPause:
		return fmt.Sprintf("pause gen=%d step=%d (%s)", a.gen, a.step, a.reason)
	case actSnapshot:
		return fmt.Sprintf("snapshot gen=%d step=%d", a.gen, a.step)
	case actRelease:
		return fmt.Sprintf("release gen=%d (%s)", a.gen, a.reason)
	case actCommit:
		return fmt.Sprintf("commit step=%d", a.step)
	case actRecover:
		return fmt.Sprintf("recover %s (%s)", a.worker, a.reason)
	case actAbandon:
		return fmt.Sprintf("abandon %v (%s)", a.steps, a.reason)
	case actProbe:
		return fmt.Sprintf("probe %v", a.servers)
	case actHold:
		return fmt.Sprintf("hold gen=%d step=%d holds=%d", a.gen, a.step, a.holds)
	case actRestore:
		if a.reason != "" {
			return fmt.Sprintf("restore %s: %s", a.plan, a.reason)
		}
		return fmt.Sprintf("restore %s", a.plan)
	}
	return fmt.Sprintf("action(%d)", a.kind)
}

// String describes the state, for traces and logs.
func (c *core) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s gen=%d step=%d snap=%d committed=%d epoch=%s", c.phase, c.gen, c.step, c.snapStep, c.committed, epochString(c.lastEpoch))
	b.WriteString(c.recoveryString())
	for _, id := range c.sortedMembers() {
		m := c.members[id]
		fmt.Fprintf(&b, " %s(e%s", id, epochString(m.epoch))
		if m.inBatch {
			b.WriteString(",batch")
		}
		if c.barrierUp() && m.arrived == c.gen {
			b.WriteString(",arrived")
		}
		b.WriteString(")")
	}
	return b.String()
}

func (p recPhase) String() string { return [...]string{"drain", "replace", "restore"}[p] }

// recoveryString describes the servers and the recovery, for traces.
func (c *core) recoveryString() string {
	var b strings.Builder
	if c.recovering {
		fmt.Fprintf(&b, " recovering(hold=%t,%s)", c.hold, c.rec.phase)
	}
	for _, id := range c.failedServers() {
		if next := c.servers[id].nextInc; next != 0 {
			fmt.Fprintf(&b, " %s(failed,next=%d)", id, next)
		} else {
			fmt.Fprintf(&b, " %s(failed)", id)
		}
	}
	if len(c.abandoned) > 0 {
		fmt.Fprintf(&b, " abandoned=%v", c.abandoned)
	}
	return b.String()
}

// String describes a plan, for traces and logs.
func (p *restorePlan) String() string {
	ids := make([]string, len(p.servers))
	for i, n := range p.servers {
		ids[i] = n.ID
	}
	s := fmt.Sprintf("%s to step=%d failed=%v replaced=%v servers=%v table=%d", p.ev.Policy, p.ev.Step,
		slices.Sorted(maps.Keys(p.ev.Failed)), p.ev.Replaced, ids, p.ev.TableVersion)
	if p.ev.Policy == Partial {
		s += fmt.Sprintf(" loading=%v", p.gaining)
	}
	return s
}
