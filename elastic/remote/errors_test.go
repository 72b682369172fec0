package remote

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/elastic/server"
	"github.com/elasticps/elasticps/shard"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/internal/rpc"
	"github.com/elasticps/elasticps/internal/transport/memnet"
	"github.com/elasticps/elasticps/ps"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sentinels are the exported sentinels of the packages whose errors a remote server's or
// coordinator's answer may carry, by name; TestEverySentinelCrossesTheWire checks that this
// list is every one the packages declare.
var sentinels = map[string]error{
	"checkpoint.ErrCorrupt":            checkpoint.ErrCorrupt,
	"checkpoint.ErrUnsupportedVersion": checkpoint.ErrUnsupportedVersion,
	"checkpoint.ErrNotFound":           checkpoint.ErrNotFound,
	"checkpoint.ErrNotCommitted":       checkpoint.ErrNotCommitted,
	"checkpoint.ErrNoCheckpoint":       checkpoint.ErrNoCheckpoint,
	"checkpoint.ErrBusy":               checkpoint.ErrBusy,
	"checkpoint.ErrClosed":             checkpoint.ErrClosed,
	"checkpoint.ErrStepOrder":          checkpoint.ErrStepOrder,
	"checkpoint.ErrSchemaMismatch":     checkpoint.ErrSchemaMismatch,
	"checkpoint.ErrTableSet":           checkpoint.ErrTableSet,
	"checkpoint.ErrRegionLocked":       checkpoint.ErrRegionLocked,
	"checkpoint.ErrIncomplete":         checkpoint.ErrIncomplete,
	"checkpoint.ErrPartialRestore":     checkpoint.ErrPartialRestore,
	"checkpoint.ErrUnknownStep":        checkpoint.ErrUnknownStep,
	"checkpoint.ErrAbandoned":          checkpoint.ErrAbandoned,
	"checkpoint.ErrInjected":           checkpoint.ErrInjected,
	"checkpoint.ErrSuperseded":         checkpoint.ErrSuperseded,
	"checkpoint.ErrDigestMismatch":     checkpoint.ErrDigestMismatch,

	"elastic.ErrInvalidConfig":  elastic.ErrInvalidConfig,
	"elastic.ErrClosed":         elastic.ErrClosed,
	"elastic.ErrNotMember":      elastic.ErrNotMember,
	"elastic.ErrStopped":        elastic.ErrStopped,
	"elastic.ErrNotFresh":       elastic.ErrNotFresh,
	"elastic.ErrReplaced":       elastic.ErrReplaced,
	"elastic.ErrCommitsBehind":  elastic.ErrCommitsBehind,
	"elastic.ErrNeedsResume":    elastic.ErrNeedsResume,
	"elastic.ErrSuperseded":     elastic.ErrSuperseded,
	"elastic.ErrPushedTwice":    elastic.ErrPushedTwice,
	"elastic.ErrBatchFailed":    elastic.ErrBatchFailed,
	"elastic.ErrNoScaler":       elastic.ErrNoScaler,
	"server.ErrNoCheckpoints":   server.ErrNoCheckpoints,
	"shard.ErrNoMoreWork":       shard.ErrNoMoreWork,
	"shard.ErrWait":             shard.ErrWait,
	"shard.ErrStaleLease":       shard.ErrStaleLease,
	"shard.ErrBadOffset":        shard.ErrBadOffset,
	"shard.ErrBadWorker":        shard.ErrBadWorker,
	"shard.ErrInvalidConfig":    shard.ErrInvalidConfig,
	"shard.ErrSnapshotCorrupt":  shard.ErrSnapshotCorrupt,
	"shard.ErrSnapshotVersion":  shard.ErrSnapshotVersion,
	"shard.ErrSnapshotMismatch": shard.ErrSnapshotMismatch,
	"shard.ErrNotStream":        shard.ErrNotStream,
	"shard.ErrStreamSealed":     shard.ErrStreamSealed,
	"shard.ErrBadPartition":     shard.ErrBadPartition,
	"shard.ErrPermanent":        shard.ErrPermanent,
	"shard.ErrMalformed":        shard.ErrMalformed,
	"shard.ErrShardMismatch":    shard.ErrShardMismatch,
	"shard.ErrSchema":           shard.ErrSchema,
	"shard.ErrClosed":           shard.ErrClosed,
	"shard.ErrTooManyBadLines":  shard.ErrTooManyBadLines,
	"shard.ErrFieldMap":         shard.ErrFieldMap,

	"ps.ErrBadConfig":      ps.ErrBadConfig,
	"ps.ErrWrongOwner":     ps.ErrWrongOwner,
	"ps.ErrUnknownTable":   ps.ErrUnknownTable,
	"ps.ErrBadRequest":     ps.ErrBadRequest,
	"ps.ErrNonFinite":      ps.ErrNonFinite,
	"ps.ErrCorrupt":        ps.ErrCorrupt,
	"ps.ErrNoTable":        ps.ErrNoTable,
	"ps.ErrClosed":         ps.ErrClosed,
	"ps.ErrFenced":         ps.ErrFenced,
	"ps.ErrPartialPush":    ps.ErrPartialPush,
	"ps.ErrMoved":          ps.ErrMoved,
	"ps.ErrMigration":      ps.ErrMigration,
	"ps.ErrNotPublished":   ps.ErrNotPublished,
	"ps.ErrCorruptApplied": ps.ErrCorruptApplied,

	// The protocol's own, and the standard library's.
	"elastic.ErrDuplicateWorker":    elastic.ErrDuplicateWorker,
	"checkpoint.ErrExistingCommits": checkpoint.ErrExistingCommits,

	"elastic.errMalformed":  errMalformed,
	"elastic.errHeld":       errHeld,
	"errors.ErrUnsupported": errors.ErrUnsupported,
}

// notOnTheWire are exported sentinels that must not cross the wire, with why.
var notOnTheWire = map[string]string{
	"elastic.ErrUnavailable": "the caller's own verdict that a call did not reach the process called",
}

// declaredSentinels returns the exported sentinels (package-level Err... = errors.New(...))
// declared in the non-test files of the package in dir, as "pkg.Name".
func declaredSentinels(t *testing.T, dir, pkg string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !n.IsExported() || !strings.HasPrefix(n.Name, "Err") || i >= len(vs.Values) {
						continue
					}
					call, ok := vs.Values[i].(*ast.CallExpr)
					if !ok {
						continue
					}
					if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "New" {
						names = append(names, pkg+"."+n.Name)
					}
				}
			}
		}
	}
	return names
}

// Every exported sentinel of checkpoint, elastic, ps and shard, and the protocol's own, crosses
// the control protocol: a handler's error that wraps one reaches the caller of a remote stub
// matching it, and no other. An error wrapping several keeps them all.
func TestEverySentinelCrossesTheWire(t *testing.T) {
	var declared []string
	for _, p := range []struct{ dir, pkg string }{{"../../checkpoint", "checkpoint"}, {"..", "elastic"}, {"../../ps", "ps"}, {"../../shard", "shard"}, {"../server", "server"}} {
		declared = append(declared, declaredSentinels(t, p.dir, p.pkg)...)
	}
	require.Contains(t, declared, "checkpoint.ErrCorrupt", "the parse finds the sentinels")
	for _, name := range declared {
		_, listed := sentinels[name]
		_, excluded := notOnTheWire[name]
		assert.True(t, listed || excluded, "%s is declared: add it to errorCodes (and to sentinels here), or to notOnTheWire with why", name)
	}

	// The table: one code per sentinel, every code distinct and in the protocol's range.
	codes, errs := map[uint32]bool{}, map[error]bool{}
	for _, e := range errorCodes {
		assert.False(t, codes[e.code], "code %d used twice", e.code)
		assert.False(t, errs[e.err], "%v listed twice", e.err)
		assert.NotEqual(t, codeFailed, e.code, "codeFailed means no sentinel")
		assert.GreaterOrEqual(t, e.code, uint32(codeMalformed))
		codes[e.code], errs[e.err] = true, true
	}

	// A real RPC server answering a method whose handler fails as the request says (the index
	// of a sentinel, or none), called through the remote stubs' call path.
	names := make([]string, 0, len(sentinels))
	for name := range sentinels {
		names = append(names, name)
	}
	slices.Sort(names)
	const methodFailing uint16 = 0x45ff
	fail := func(i uint32) error {
		switch {
		case i == 1<<20:
			return errors.New("a failure of no kind")
		case i == 1<<21: // two at once, as a restore that failed on damaged data
			return fmt.Errorf("restore: %w: chunk t1-s0-p0: %w", checkpoint.ErrPartialRestore, checkpoint.ErrCorrupt)
		case i == 1<<22: // a typed error that matches a sentinel
			return &ps.WrongOwnerError{Server: "ps-0:1", Slot: 3, Version: 7}
		}
		return fmt.Errorf("load step 12 on ps-1: %w", sentinels[names[i]])
	}
	net := memnet.New(memnet.Config{})
	secret := []byte("a secret of the wire error tests.")
	srv, err := ps.NewServer(ps.ServerConfig{ID: "ps-0", Secret: secret, Slots: 8, Transport: net.Host("ps-0")})
	require.NoError(t, err)
	defer srv.Close()
	require.NoError(t, srv.Register(methodFailing, func(_ context.Context, req []byte, _ *rpc.Buffer) error {
		return remoteErr(fail(binary.LittleEndian.Uint32(req)))
	}))
	l, err := net.Host("ps-0").Listen("ps-0:1")
	require.NoError(t, err)
	go srv.Serve(l)
	r, err := newRemote(Config{Addr: "ps-0:1", Secret: secret, Transport: net.Host("coord")})
	require.NoError(t, err)
	defer r.rpc.Close()
	call := func(i uint32) error {
		return r.call(context.Background(), methodFailing, binary.LittleEndian.AppendUint32(nil, i), nil)
	}

	for i, name := range names {
		if _, excluded := notOnTheWire[name]; excluded {
			continue
		}
		got := call(uint32(i))
		require.Error(t, got, name)
		for _, other := range names {
			if other == name {
				assert.ErrorIs(t, got, sentinels[name], "%s crosses the wire", name)
			} else {
				assert.NotErrorIs(t, got, sentinels[other], "%s arrives as %s too", name, other)
			}
		}
		assert.Contains(t, got.Error(), "ps-0:1", "the error names the server")
		assert.Contains(t, got.Error(), "load step 12 on ps-1", "the error keeps the handler's text")
	}

	got := call(1 << 20)
	require.Error(t, got)
	for _, name := range names {
		assert.NotErrorIs(t, got, sentinels[name])
	}
	assert.Contains(t, got.Error(), "a failure of no kind")

	got = call(1 << 21)
	assert.ErrorIs(t, got, checkpoint.ErrPartialRestore)
	assert.ErrorIs(t, got, checkpoint.ErrCorrupt, "a restore that failed on damaged data says so")
	assert.NotErrorIs(t, got, checkpoint.ErrNotFound)

	got = call(1 << 22)
	assert.ErrorIs(t, got, ps.ErrWrongOwner)

	got = localErr("ps-0:1", remoteErr(fmt.Errorf("a server it called: %w", elastic.ErrUnavailable)))
	assert.NotErrorIs(t, got, elastic.ErrUnavailable, "an answer is never a call that did not arrive")

	// A peer that sends only a code (an earlier release) is read by it.
	got = localErr("ps-0:1", &rpc.RemoteError{Code: codeBusy, Message: "both generations busy"})
	assert.ErrorIs(t, got, checkpoint.ErrBusy)
}
