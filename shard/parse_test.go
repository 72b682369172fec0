package shard_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/elasticps/elasticps/shard"
	"github.com/elasticps/elasticps/shard/shardtest"
)

func criteoLine(label string, ints []string, cats []string) string {
	return label + "\t" + strings.Join(ints, "\t") + "\t" + strings.Join(cats, "\t")
}

func TestCriteoParse(t *testing.T) {
	ints := make([]string, 13)
	cats := make([]string, 26)
	ints[0], ints[1], ints[12] = "1", "-3", "0"
	cats[0], cats[1], cats[25] = "68fd1e64", "", "ABCDEF01"
	var rec shard.Record
	if err := (shard.Criteo{}).Parse([]byte(criteoLine("1", ints, cats)+"\r"), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Label != 1 || len(rec.Dense) != 13 || rec.NumFields() != 26 || len(rec.IDs) != 2 {
		t.Fatalf("%+v", rec)
	}
	if rec.Dense[0] != float32(math.Log1p(1)) || rec.Dense[1] != 0 || rec.Dense[2] != 0 {
		t.Fatalf("dense %v", rec.Dense)
	}
	if got := rec.Field(0); len(got) != 1 || got[0] != shard.FeatureID(0, []byte("68fd1e64")) {
		t.Fatalf("field 0 %v", got)
	}
	if len(rec.Field(1)) != 0 || rec.Field(25)[0] != shard.FeatureID(25, []byte("ABCDEF01")) {
		t.Fatal("fields 1, 25")
	}
	rec.Reset()
	if err := (shard.Criteo{RawDense: true}).Parse([]byte(criteoLine("0", ints, cats)), &rec); err != nil || rec.Dense[1] != -3 {
		t.Fatalf("raw: %v %v", err, rec.Dense)
	}
	for name, line := range map[string]string{
		"short":     "1\t2\t3",
		"long":      criteoLine("1", ints, cats) + "\tx",
		"label":     criteoLine("x", ints, cats),
		"int":       criteoLine("1", append([]string{"1.5"}, ints[1:]...), cats),
		"hex":       criteoLine("1", ints, append([]string{"zz"}, cats[1:]...)),
		"empty":     "",
		"hexlength": criteoLine("1", ints, append([]string{"0123456789abcdef0"}, cats[1:]...)),
		"labelonly": "1",
		"nanlabel":  criteoLine("NaN", ints, cats),
		"inflabel":  criteoLine("+Inf", ints, cats),
		"label2":    criteoLine("2", ints, cats),
	} {
		rec.Reset()
		if err := (shard.Criteo{}).Parse([]byte(line), &rec); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestFeatureIDFieldsDoNotCollide(t *testing.T) {
	seen := make(map[uint64]string)
	for f := range 30 {
		for _, v := range []string{"", "0", "1", "68fd1e64", "Comedy"} {
			id := shard.FeatureID(f, []byte(v))
			if id != shard.FeatureIDString(f, v) {
				t.Fatal("FeatureID and FeatureIDString differ")
			}
			if prev, dup := seen[id]; dup {
				t.Fatalf("field %d %q collides with %s", f, v, prev)
			}
			seen[id] = v
		}
	}
}

func TestLibSVMParse(t *testing.T) {
	var rec shard.Record
	if err := (shard.LibSVM{}).Parse([]byte("-1 qid:3 7:0.5\t12:1  # comment 9:9"), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Label != 0 || rec.NumFields() != 1 || len(rec.IDs) != 2 || rec.IDs[0] != 7 || rec.Values[0] != 0.5 || rec.IDs[1] != 12 {
		t.Fatalf("%+v", rec)
	}
	for _, line := range []string{"", "  ", "x 1:1", "1 1", "1 a:1", "1 1:b", "1 99999999999999999999:1",
		"1", "+1 # a label and no feature", "2.5 1:1", "nan 1:1", "1 1:nan", "1 1:inf", "1 1:-Inf", "1 1:1e39"} {
		rec.Reset()
		if err := (shard.LibSVM{}).Parse([]byte(line), &rec); err == nil {
			t.Errorf("%q accepted", line)
		}
	}
}

func TestBatchAppend(t *testing.T) {
	var b shard.Batch
	b.Reset()
	r1 := shard.Record{Label: 1, Dense: []float32{1, 2}, IDs: []uint64{5, 6, 7}, FieldEnds: []int32{1, 3}, Offset: 4}
	r2 := shard.Record{Label: 0, Dense: []float32{3, 4}, IDs: []uint64{8}, FieldEnds: []int32{0, 1}, Values: []float32{0.5}, Offset: 6}
	if err := b.Append(&r1); err != nil {
		t.Fatal(err)
	}
	if err := b.Append(&r2); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 2 || b.DenseDim != 2 || b.NumFields != 2 || len(b.Values) != 4 || b.Values[3] != 0.5 || b.Values[0] != 1 {
		t.Fatalf("%+v", b)
	}
	if got := b.Field(0, 1); len(got) != 2 || got[1] != 7 {
		t.Fatalf("field(0,1) %v", got)
	}
	if got := b.Field(1, 0); len(got) != 0 {
		t.Fatalf("field(1,0) %v", got)
	}
	if got := b.Field(1, 1); len(got) != 1 || got[0] != 8 {
		t.Fatalf("field(1,1) %v", got)
	}
	bad := shard.Record{Dense: []float32{1}, FieldEnds: []int32{0, 0}}
	if err := b.Append(&bad); !errors.Is(err, shard.ErrSchema) || b.Len() != 2 {
		t.Fatalf("schema: %v", err)
	}
	b.Start, b.End = 3, 10
	if b.Skipped() != 5 {
		t.Fatalf("skipped %d", b.Skipped())
	}
}

// The parsers must never panic, and what they accept must be a well-formed record.
func checkParsed(t *testing.T, p shard.Parser, line []byte) {
	var rec shard.Record
	if err := p.Parse(line, &rec); err != nil {
		return
	}
	s := p.Schema()
	if len(rec.Dense) != s.Dense || rec.NumFields() != len(s.Fields) {
		t.Fatalf("%q: %d dense %d fields, schema %+v", line, len(rec.Dense), rec.NumFields(), s)
	}
	var b shard.Batch
	if err := b.Append(&rec); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
}

func FuzzCriteo(f *testing.F) {
	for _, l := range strings.Split(shardtest.CriteoLines(5, 1), "\n") {
		f.Add([]byte(l))
	}
	f.Add([]byte("1\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t"))
	f.Fuzz(func(t *testing.T, line []byte) { checkParsed(t, shard.Criteo{}, line) })
}

func FuzzLibSVM(f *testing.F) {
	for _, l := range strings.Split(shardtest.LibSVMLines(5, 1), "\n") {
		f.Add([]byte(l))
	}
	f.Add([]byte("1 qid:1 3:1e10 # x"))
	f.Fuzz(func(t *testing.T, line []byte) { checkParsed(t, shard.LibSVM{}, line) })
}
