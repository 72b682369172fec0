package ps

import (
	"testing"

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
