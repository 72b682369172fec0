package statuspage

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGrid(t *testing.T) {
	owners := []string{"ps-0", "ps-0", "ps-0", "ps-1", "ps-1", "", "ps-0", "ps-0", "ps-0"}
	g := gridOf(owners, []int{3, 8, 99}, map[string]string{"ps-0": "#0072B2"})
	assert.Equal(t, 9, g.Slots)
	assert.Equal(t, 4, g.Cols, "rows of a power of two of slots, near a square")
	assert.Equal(t, 3, g.Rows)
	require.Len(t, g.Owners, 2)
	assert.Equal(t, ownerView{ID: "ps-0", Color: "#0072B2", Path: "M0 0h3v1h-3zM2 1h2v1h-2zM0 2h1v1h-1z", Slots: 6, Migrating: 1}, g.Owners[0],
		"a run of slots is one rectangle, cut at the row's end")
	assert.Equal(t, ownerView{ID: "ps-1", Color: palette[len(palette)-1], Path: "M3 0h1v1h-1zM0 1h1v1h-1z", Slots: 2, Migrating: 1}, g.Owners[1],
		"a server without a colour gets the last one")
	assert.Equal(t, "M1 1h1v1h-1z", g.Unowned)
	assert.Equal(t, 2, g.Migrating, "a slot out of range is ignored")
	assert.Equal(t, "M3 0h1v1h-1zM0 2h1v1h-1z", g.MigratingPath)
	assert.Equal(t, gridView{}, gridOf(nil, nil, nil))

	big := make([]string, 4096)
	for i := range big {
		big[i] = "ps-" + string(rune('0'+i%3))
	}
	g = gridOf(big, nil, nil)
	assert.Equal(t, 64, g.Cols)
	assert.Equal(t, 64, g.Rows)
}

func TestServerColors(t *testing.T) {
	c := serverColors([]Member{{Role: RoleServer, ID: "ps-0"}, {Role: RoleServer, ID: "ps-9"}, {Role: RoleServer, ID: "alpha"},
		{Role: RoleWorker, ID: "worker-3"}})
	assert.Equal(t, map[string]string{"ps-0": palette[0], "ps-9": palette[9], "alpha": palette[2]}, c,
		"by the number that ends the ID, else by position")
}

func TestChart(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c := chartOf(Series{Name: SeriesThroughput, Unit: "records/s", Points: []Point{{t0, 100}, {t0.Add(time.Second), 200}, {t0.Add(2 * time.Second), 0}}}, t0, time.Second)
	assert.Equal(t, "46.0,52.0 179.0,12.0 312.0,92.0", c.Points, "time across, 0 at the axis, the top 5% above the highest")
	assert.Equal(t, "0", c.Last)
	assert.Equal(t, "210", c.YHi)
	assert.Equal(t, "0", c.YLo)
	assert.Equal(t, "last 2s", c.Span)
	assert.Equal(t, 312.0, c.DotX)
	assert.Equal(t, 92.0, c.DotY)

	c = chartOf(Series{Name: "auc", Points: []Point{{t0, 0.7}, {t0.Add(time.Second), 0.8}}}, t0, time.Second)
	assert.Equal(t, "0.7", c.YLo, "a series far from 0 is drawn over its own range")
	assert.Equal(t, "0.805", c.YHi)
	c = chartOf(Series{Name: "loss", Points: []Point{{t0, 0.5}}}, t0, time.Second)
	assert.Equal(t, "0.45", c.YLo, "one value: a band around it")
	assert.Equal(t, "last 1s", c.Span)

	c = chartOf(Series{Name: "loss"}, t0, time.Second)
	assert.Equal(t, "none observed yet", c.Empty)
	assert.Equal(t, "no values yet", chartOf(Series{Name: SeriesThroughput}, t0, time.Second).Empty)
}

func TestCheckpointTimeline(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var cs []Checkpoint
	for i := range 60 {
		cs = append(cs, Checkpoint{Step: uint64(10 * (i + 1)), At: t0, Blocked: time.Duration(i+1) * time.Millisecond, Committed: i < 58,
			CommitLag: 200 * time.Millisecond})
	}
	cs[59].Err = "storage: quota"
	v := ckptOf(cs)
	assert.Equal(t, 60, v.N)
	require.Len(t, v.Pause, ckptBars, "the newest only")
	assert.Len(t, v.Lag, ckptBars-1, "the one persisting has no commit bar")
	assert.Equal(t, "step 130", v.First)
	assert.Equal(t, "step 600", v.Last)
	assert.Equal(t, "60ms", v.PauseMax)
	assert.Equal(t, "fail", v.Pause[ckptBars-1].Class)
	require.Len(t, v.Rows, 6)
	assert.Equal(t, ckptRow{Step: 600, At: "12:00:00", Pause: "60ms", Bytes: "0 B", Kind: "incremental", State: "failed: storage: quota", Failed: true}, v.Rows[0])
	assert.Equal(t, "persisting", v.Rows[1].State)
	assert.Equal(t, "committed", v.Rows[2].State)
	assert.Equal(t, "200ms", v.Rows[2].Lag)
	top := v.Pause[ckptBars-1]
	assert.Equal(t, 0.0, top.Y, "the longest pause fills its row")
	assert.Equal(t, 38.0, top.H)
	assert.True(t, strings.HasPrefix(top.Title, "step 600: paused 60ms"))
}

func TestFormats(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 0.000123: "0.000123", 0.5: "0.5", 3.14159: "3.14", 512: "512", 12345: "12.3k",
		-4e6: "-4.0M", 2.5e9: "2.5G"} {
		assert.Equal(t, want, num(v), "%g", v)
	}
	for d, want := range map[time.Duration]string{0: "0", 850 * time.Microsecond: "850µs", 12 * time.Millisecond: "12ms",
		1234 * time.Millisecond: "1.2s", 200 * time.Second: "3m20s"} {
		assert.Equal(t, want, durText(d))
	}
	assert.Equal(t, "512 B", bytesText(512))
	assert.Equal(t, "1.5 KiB", bytesText(1536))
	assert.Equal(t, "2.0 GiB", bytesText(2<<30))
	assert.Equal(t, "", clock(time.Time{}))
}
