package shard_test

import (
	"math"
	"strings"
	"testing"

	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseLabelOnePolicy(t *testing.T) {
	for in, want := range map[string]float32{
		"0": 0, "-1": 0, "1": 1, "+1": 1, "1.0": 1, "-1.0": 0, "0.0": 0, "0.25": 0.25, "1e0": 1,
	} {
		got, err := shard.ParseLabel([]byte(in))
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "2", "-0.5", "1.5", "NaN", "nan", "Inf", "-inf", "+Infinity", "x", "1e39"} {
		_, err := shard.ParseLabel([]byte(in))
		assert.Error(t, err, "%q accepted", in)
	}
	// Every parser reads labels the same way: -1/+1 files mean what 0/1 files mean.
	ints, cats := make([]string, 13), make([]string, 26)
	for _, c := range []struct {
		p          shard.Parser
		neg, pos   string
		negs, poss string
	}{
		{shard.Criteo{}, criteoLine("0", ints, cats), criteoLine("1", ints, cats), criteoLine("-1", ints, cats), criteoLine("+1", ints, cats)},
		{shard.LibSVM{}, "0 1:1", "1 1:1", "-1 1:1", "+1 1:1"},
		{shard.LibFM{Fields: 1}, "0 0:1:1", "1 0:1:1", "-1 0:1:1", "+1 0:1:1"},
	} {
		for line, want := range map[string]float32{c.neg: 0, c.negs: 0, c.pos: 1, c.poss: 1} {
			var rec shard.Record
			require.NoError(t, c.p.Parse([]byte(line), &rec), "%T %q", c.p, line)
			assert.Equal(t, want, rec.Label, "%T %q", c.p, line)
		}
	}
}

func TestLibFMParse(t *testing.T) {
	p := shard.LibFM{Fields: 4}
	assert.Equal(t, []string{"F0", "F1", "F2", "F3"}, p.Schema().Fields)
	var rec shard.Record
	// Fields out of order and a multi-hot field: grouped by field, in the order written.
	require.NoError(t, p.Parse([]byte("+1 2:7:0.5 0:3:1\t2:9:2 3:11:-1.5 # 1:1:1\r"), &rec))
	assert.Equal(t, float32(1), rec.Label)
	assert.Empty(t, rec.Dense)
	require.Equal(t, 4, rec.NumFields())
	assert.Equal(t, []uint64{3}, rec.Field(0))
	assert.Empty(t, rec.Field(1), "field 1 only in the comment")
	assert.Equal(t, []uint64{7, 9}, rec.Field(2))
	assert.Equal(t, []uint64{11}, rec.Field(3))
	assert.Equal(t, []float32{1, 0.5, 2, -1.5}, rec.Values)
	var b shard.Batch
	require.NoError(t, b.Append(&rec))

	// The record is reused: a sorted line after an unsorted one.
	rec.Reset()
	require.NoError(t, p.Parse([]byte("0 0:1:1 1:2:1 1:3:0.5"), &rec))
	assert.Equal(t, []int32{1, 3, 3, 3}, rec.FieldEnds)
	assert.Equal(t, []float32{1, 1, 0.5}, rec.Values)

	for _, line := range []string{"", "1", "-1   ", "1 0:1", "1 4:1:1", "1 a:1:1", "1 0:b:1", "1 0:1:c",
		"1 0:1:nan", "1 0:1:inf", "NaN 0:1:1", "2 0:1:1", "1 0:1:1 7", "1 -1:1:1"} {
		rec.Reset()
		assert.Error(t, p.Parse([]byte(line), &rec), "%q accepted", line)
	}
	rec.Reset()
	assert.ErrorIs(t, shard.LibFM{}.Parse([]byte("1 0:1:1"), &rec), shard.ErrInvalidConfig)
}

func TestLibFMFields(t *testing.T) {
	assert.Equal(t, 0, shard.LibFMFields(nil))
	assert.Equal(t, 0, shard.LibFMFields([]byte("1 3:1\n0 7:1\n")), "libSVM lines have no fields")
	assert.Equal(t, 6, shard.LibFMFields([]byte("1 0:3:1 2:1:1\n0 5:9:1 # 9:1:1\n-1 1:1:1\r\n0 x:1:1 99999:1:1")))
}

func TestLibSVMFieldMap(t *testing.T) {
	m, err := shard.ParseFieldMap("user=0-999, item=1000-4999\n# genres and a single index\ngenre=5000-5099,user=10000\n")
	require.NoError(t, err)
	assert.Equal(t, []string{"user", "item", "genre"}, m.Names())
	for idx, want := range map[uint64]int{0: 0, 999: 0, 1000: 1, 4999: 1, 5000: 2, 5099: 2, 10000: 0} {
		f, ok := m.Field(idx)
		assert.True(t, ok, idx)
		assert.Equal(t, want, f, idx)
	}
	for _, idx := range []uint64{5100, 9999, 10001, math.MaxUint64} {
		_, ok := m.Field(idx)
		assert.False(t, ok, idx)
	}
	again, err := shard.ParseFieldMap(m.String())
	require.NoError(t, err)
	assert.Equal(t, m.String(), again.String())

	p := shard.LibSVM{Fields: m}
	assert.Equal(t, []string{"user", "item", "genre"}, p.Schema().Fields)
	var rec shard.Record
	require.NoError(t, p.Parse([]byte("-1 5003:1 17:1 1200:0.5 10000:2"), &rec))
	assert.Equal(t, []int32{2, 3, 4}, rec.FieldEnds)
	assert.Equal(t, []uint64{17, 10000, 1200, 5003}, rec.IDs)
	assert.Equal(t, []float32{1, 2, 0.5, 1}, rec.Values)
	rec.Reset()
	err = p.Parse([]byte("1 17:1 7777:1"), &rec)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "7777")

	_, err = shard.ParseFieldMap("a=0-10,b=5-20,c=x,=3,d=9-2")
	require.ErrorIs(t, err, shard.ErrFieldMap)
	for _, want := range []string{"overlap", `"c=x"`, `"=3"`, `"d=9-2"`} {
		assert.Contains(t, err.Error(), want)
	}
	_, err = shard.ParseFieldMap(" # nothing")
	assert.ErrorIs(t, err, shard.ErrFieldMap)
}

func FuzzLibFM(f *testing.F) {
	for _, l := range []string{"1 0:3:1 2:1:0.5", "-1 3:9:1 0:1:1 3:2:2 # c", "0", "1 0:1", "+1 1:1:nan", "1\t2:18446744073709551615:1e-3"} {
		f.Add([]byte(l))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		p := shard.LibFM{Fields: 4}
		checkParsed(t, p, line)
		var rec shard.Record
		if p.Parse(line, &rec) != nil {
			return
		}
		// What is accepted is what the line says: every triple lands in its field, values finite.
		if len(rec.IDs) == 0 || len(rec.Values) != len(rec.IDs) || !(rec.Label >= 0 && rec.Label <= 1) {
			t.Fatalf("%q: %+v", line, rec)
		}
		for _, v := range rec.Values {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%q: value %v", line, v)
			}
		}
		s := string(line)
		if i := strings.IndexByte(s, '#'); i >= 0 {
			s = s[:i]
		}
		if n := len(strings.Fields(s)) - 1; n != len(rec.IDs) {
			t.Fatalf("%q: %d triples, %d ids", line, n, len(rec.IDs))
		}
	})
}

func FuzzLibSVMFieldMap(f *testing.F) {
	m, err := shard.ParseFieldMap("a=0-9,b=10-19,c=20-29")
	if err != nil {
		f.Fatal(err)
	}
	for _, l := range []string{"1 3:1 15:0.5 25:1 4:2", "-1 29:1 0:1", "0 30:1", "1"} {
		f.Add([]byte(l))
	}
	f.Fuzz(func(t *testing.T, line []byte) { checkParsed(t, shard.LibSVM{Fields: m}, line) })
}
