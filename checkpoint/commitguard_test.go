package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A reference that names a valid, complete manifest with the right size but another sum is
// refused: the commit covers every slot otherwise, so only the sum can fail it. Nothing is
// committed; the true references then commit.
func TestCommitRefusesAReferenceWithAnotherSum(t *testing.T) {
	ctx := context.Background()
	st := NewMemStorage()
	cl := newCluster(t, st, 16)
	tabs, ts := tables2()
	fill(rand.New(rand.NewPCG(3, 3)), ts, 50, 500)
	ck := cl.open(cl.cfg("ps0", tabs))
	tabs2, ts2 := tables2()
	fill(rand.New(rand.NewPCG(4, 4)), ts2, 50, 500)
	ck2 := cl.open(cl.cfg("ps1", tabs2))
	m := cl.committer()
	_, a := snap(t, ck, 1, SnapshotSlots([]int{0, 1, 2, 3, 4, 5, 6, 7}))
	_, b := snap(t, ck2, 1, SnapshotSlots([]int{8, 9, 10, 11, 12, 13, 14, 15}))
	for _, bad := range []ManifestRef{func() ManifestRef { r := b; r.Sum++; return r }(), func() ManifestRef { r := b; r.Sum ^= 1 << 63; return r }()} {
		_, err := m.Commit(ctx, 1, []ManifestRef{a, bad})
		require.ErrorIs(t, err, ErrIncomplete)
		assert.ErrorIs(t, err, ErrCorrupt)
		assert.Contains(t, err.Error(), b.Name, "the error names the manifest")
	}
	commits, err := m.Commits(ctx)
	require.NoError(t, err)
	assert.Empty(t, commits, "a refused commit wrote a record")
	_, err = m.Commit(ctx, 1, []ManifestRef{a, b})
	require.NoError(t, err, "the true references commit")
}

// quarantineCase is one injected storage fault for TestQuarantineFaultKeepsRecordOrCopy.
type quarantineCase struct {
	name  string
	fault Fault
}

func quarantineFaults() []quarantineCase {
	var cases []quarantineCase
	add := func(what, match string, ops ...Op) {
		for _, op := range ops {
			cases = append(cases, quarantineCase{fmt.Sprintf("%s %s", op, what), Fault{Op: op, Match: match, Nth: 1}})
			if op == OpRename || op == OpDelete || op == OpWrite {
				// The operation takes effect, and yet the caller sees an error.
				cases = append(cases, quarantineCase{fmt.Sprintf("%s %s, done", op, what), Fault{Op: op, Match: match, Nth: 1, After: true}})
			}
		}
	}
	add("the record", "/commits/", OpOpen, OpRead, OpDelete)
	add("the reason", "/reason", OpCreate, OpWrite, OpSync, OpRename)
	add("the copy", "/commit", OpCreate, OpWrite, OpSync, OpRename) // no other object is created meanwhile
	cases = append(cases, quarantineCase{"short write of the copy", Fault{Op: OpWrite, Match: "/commit", Nth: 1, Short: true}})
	return cases
}

// A storage fault at each step of a quarantine (reading the record, writing the reason,
// writing the copy, deleting the record) leaves the commit record in place or its copy in the
// quarantine, whole, and never neither. A quarantine that failed is done by the next try.
func TestQuarantineFaultKeepsRecordOrCopy(t *testing.T) {
	ctx := context.Background()
	for _, tc := range quarantineFaults() {
		t.Run(tc.name, func(t *testing.T) {
			fs := NewFaultStorage(NewMemStorage())
			cl := newCluster(t, fs, 16)
			tabs, ts := tables2()
			fill(rand.New(rand.NewPCG(5, 5)), ts, 50, 500)
			ck := cl.open(cl.cfg("ps0", tabs))
			m := cl.committer()
			_, ref := snap(t, ck, 1)
			_, err := m.Commit(ctx, 1, []ManifestRef{ref})
			require.NoError(t, err)
			record, err := getObject(ctx, fs, commitName("job", 1), nil, -1, maxCommitRecord)
			require.NoError(t, err)

			reached := make(chan struct{}, 1)
			ft := tc.fault
			ft.Reached = reached
			fs.Inject(ft)
			dir, qerr := m.Quarantine(ctx, 1, errors.New("a flipped byte"))
			fs.Clear()
			require.Len(t, reached, 1, "the fault fired")

			kept, err := getObject(ctx, fs, commitName("job", 1), nil, -1, maxCommitRecord)
			haveRecord := err == nil
			if !haveRecord {
				require.ErrorIs(t, err, ErrNotFound)
			} else {
				assert.True(t, bytes.Equal(record, kept), "the record was changed")
			}
			dirs, err := m.Quarantined(ctx)
			require.NoError(t, err)
			haveCopy := false
			for _, d := range dirs {
				cp, err := getObject(ctx, fs, d+"/commit", nil, -1, maxCommitRecord)
				require.NoError(t, err, "a listed copy is readable")
				require.True(t, bytes.Equal(record, cp), "a listed copy is the record, whole")
				haveCopy = true
			}
			require.True(t, haveRecord || haveCopy, "the fault left neither the record nor its copy (quarantine: %v)", qerr)
			if qerr == nil {
				assert.False(t, haveRecord, "a quarantine that succeeded left the record")
				assert.Contains(t, dirs, dir)
				return
			}
			if haveRecord {
				// The next try moves it.
				_, err := m.Quarantine(ctx, 1, errors.New("a flipped byte"))
				require.NoError(t, err)
				_, err = getObject(ctx, fs, commitName("job", 1), nil, -1, maxCommitRecord)
				assert.ErrorIs(t, err, ErrNotFound)
				dirs, err = m.Quarantined(ctx)
				require.NoError(t, err)
				assert.NotEmpty(t, dirs)
			}
			// Whatever the fault, the commit is never restorable again and retention keeps what
			// the copy names.
			commits, err := m.Commits(ctx)
			require.NoError(t, err)
			assert.Empty(t, commits)
		})
	}
}
