package ps

import (
	"testing"
	"time"

	"github.com/elasticps/elasticps/internal/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An abort that overtakes a migration's fence or open (its caller gave up) wins: the fence finds
// the migration ended and fences nothing, and an open of that id afterwards is refused.
func TestAbortOvertakingFenceAndOpen(t *testing.T) {
	s, err := NewServer(ServerConfig{ID: "a", Secret: []byte("an internal test secret of 32 B."), Slots: 16})
	require.NoError(t, err)
	defer s.Close()
	tab, err := NewOwnerTable(1, 16, []Node{{ID: "a"}}, nil)
	require.NoError(t, err)
	_, err = s.SetOwnerTable(tab)
	require.NoError(t, err)

	_, err = s.openMigration(7, "b", []int{3, 5})
	require.NoError(t, err)
	m, err := s.outMigration(7)
	require.NoError(t, err)
	s.AbortMigration(7) // after the fence looked the migration up, before it fences
	_, err = s.fenceOf(m)
	assert.Error(t, err)
	assert.False(t, s.own.fenced.Has(3), "no fence without a migration to lift it")

	s.AbortMigration(9) // the abort of a migration whose open is still on its way
	_, err = s.openMigration(9, "b", []int{4})
	assert.Error(t, err, "an open after its abort is refused")
	_, err = s.openMigration(10, "b", []int{4})
	assert.NoError(t, err)
}

func migServer(t *testing.T, ttl time.Duration) *Server {
	t.Helper()
	s, err := NewServer(ServerConfig{ID: "a", Secret: []byte("an internal test secret of 32 B."), Slots: 16, MigrationTTL: ttl})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	tab, err := NewOwnerTable(1, 16, []Node{{ID: "a"}, {ID: "b"}}, nil)
	require.NoError(t, err)
	_, err = s.SetOwnerTable(tab)
	require.NoError(t, err)
	return s
}

func openMigrations(s *Server) int {
	s.mig.mu.Lock()
	defer s.mig.mu.Unlock()
	return len(s.mig.out)
}

// A migration nobody uses ends after its TTL, unless it is fenced (its destination may hold
// the final copy): that one waits for its release or an abort.
func TestIdleMigrationEndsUnlessFenced(t *testing.T) {
	s := migServer(t, 30*time.Millisecond)
	owned := s.OwnerTable().SlotsOf("a").Members()
	_, err := s.openMigration(1, "b", owned[:1])
	require.NoError(t, err)
	_, err = s.openMigration(2, "b", owned[1:2])
	require.NoError(t, err)
	_, err = s.fenceMigration(2)
	require.NoError(t, err)
	deadline := time.Now().Add(5 * time.Second)
	for openMigrations(s) > 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	require.Equal(t, 1, openMigrations(s), "the unfenced one ended")
	time.Sleep(100 * time.Millisecond) // three TTLs: the fenced one must still be there
	assert.Equal(t, 1, openMigrations(s))
	assert.True(t, s.own.fenced.Has(owned[1]))

	assert.Equal(t, 1, s.AbortMigrations(), "a new coordinator ends what its predecessor left")
	assert.Zero(t, openMigrations(s))
	assert.False(t, s.own.fenced.Has(owned[1]), "fence lifted: the server still owns the slot")
}

// A table that gives a migration's slots away releases it, whoever published the table.
func TestTableGivingSlotsAwayReleasesTheMigration(t *testing.T) {
	s := migServer(t, time.Minute)
	tab := s.OwnerTable()
	slot := tab.SlotsOf("a").Members()[0]
	_, err := s.openMigration(3, "b", []int{slot})
	require.NoError(t, err)
	_, err = s.fenceMigration(3)
	require.NoError(t, err)
	next, err := tab.WithMoves(2, tab.Nodes, []Move{{Slot: slot, From: "a", To: "b"}})
	require.NoError(t, err)
	_, err = s.SetOwnerTable(next)
	require.NoError(t, err)
	s.mig.wg.Wait()
	assert.Zero(t, openMigrations(s))
}

// A base chunk of the default size, with its cursor and its frame's tag, fits in a pooled frame
// buffer, whatever the record size: the budget a destination asks for leaves room for the
// record a chunk may overshoot it by.
func TestChunkFitsPooledFrame(t *testing.T) {
	def := MigrationSpec{}.withDefaults().ChunkBytes
	for _, rec := range []int{24, 528, 4112, 64 << 10} {
		worst := 8 + chunkBudget(def, rec) - 1 + rec + wire.TagSize
		assert.LessOrEqual(t, worst, wire.MaxPooledSize, "record of %d bytes", rec)
		assert.LessOrEqual(t, worst, def, "record of %d bytes", rec)
	}
	assert.Equal(t, 1, chunkBudget(100, 528), "a record larger than the chunk: one record at a time")
}
