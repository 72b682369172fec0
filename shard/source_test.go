package shard_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/elasticps/elasticps/shard"
)

// labelParser reads lines "<label>" and rejects lines starting with '!'.
type labelParser struct{}

func (labelParser) Schema() shard.Schema { return shard.Schema{} }
func (labelParser) Parse(line []byte, rec *shard.Record) error {
	if len(line) == 0 || line[0] == '!' {
		return errors.New("bang")
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(string(line)), 32)
	rec.Label = float32(v)
	return err
}

// noSeekFS hides the Seek method of its files.
type noSeekFS struct{ fs.FS }

type noSeekFile struct{ f fs.File }

func (n noSeekFS) Open(name string) (fs.File, error) {
	f, err := n.FS.Open(name)
	if err != nil {
		return nil, err
	}
	return noSeekFile{f}, nil
}
func (f noSeekFile) Stat() (fs.FileInfo, error) { return f.f.Stat() }
func (f noSeekFile) Read(b []byte) (int, error) { return f.f.Read(b) }
func (f noSeekFile) Close() error               { return f.f.Close() }

func numbered(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		b.WriteString(strings.Repeat(" ", i%3))
		b.WriteString(itoa(i))
		b.WriteByte('\n')
	}
	return b.String()
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var d []byte
	for ; i > 0; i /= 10 {
		d = append([]byte{byte('0' + i%10)}, d...)
	}
	return string(d)
}

func TestSplitText(t *testing.T) {
	ctx := context.Background()
	fsys := fstest.MapFS{
		"a.txt": {Data: []byte("header\n" + numbered(0, 10))},
		"b.txt": {Data: []byte("header\r\n" + numbered(10, 14) + "14")}, // no final newline
		"c.txt": {Data: []byte("header\n")},
	}
	shards, err := shard.SplitText(ctx, fsys, []string{"a.txt", "b.txt", "c.txt"}, shard.SplitConfig{RecordsPerShard: 4, HeaderLines: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		file    string
		records int64
		line    int64
	}{{"a.txt", 4, 2}, {"a.txt", 4, 6}, {"a.txt", 2, 10}, {"b.txt", 4, 2}, {"b.txt", 1, 6}}
	if len(shards) != len(want) {
		t.Fatalf("%d shards: %+v", len(shards), shards)
	}
	var base int64
	for i, w := range want {
		s := shards[i]
		if s.File != w.file || s.Records != w.records || s.Line != w.line || s.Base != base || s.Index != i || s.Kind != shard.KindText {
			t.Fatalf("shard %d = %+v, want %+v", i, s, w)
		}
		base += s.Records
	}
	if _, err := shard.SplitText(ctx, fsys, []string{"missing"}, shard.SplitConfig{}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	// Every shard reads back its own lines, from any offset, seekable or not, shuffled or not.
	for _, fsys := range []fs.FS{fsys, noSeekFS{fsys}} {
		for _, seed := range []uint64{0, 99} {
			var got []float32
			for _, s := range shards {
				for _, from := range []int64{0, 1} {
					src := shard.TextSource{FS: fsys, Parser: labelParser{}}
					cur, err := src.Open(ctx, shard.Lease{Shard: s, Offset: from, ShuffleSeed: seed})
					if err != nil {
						t.Fatal(err)
					}
					order := shard.RecordOrder(seed, s.Records)
					var rec shard.Record
					pos := from
					for {
						err := cur.Next(&rec)
						if err == io.EOF {
							break
						}
						if err != nil {
							t.Fatalf("shard %d: %v", s.Index, err)
						}
						if rec.Offset != pos || rec.Label != float32(s.Global(int64(order[pos]))) {
							t.Fatalf("shard %d seed %d pos %d: offset %d label %v", s.Index, seed, pos, rec.Offset, rec.Label)
						}
						if from == 0 {
							got = append(got, rec.Label)
						}
						pos++
					}
					if pos != s.Records {
						t.Fatalf("shard %d read to %d", s.Index, pos)
					}
					_ = cur.Close()
				}
			}
			if len(got) != 15 {
				t.Fatalf("read %d records", len(got))
			}
		}
	}
}

func TestTextSourceErrors(t *testing.T) {
	ctx := context.Background()
	fsys := fstest.MapFS{"f": {Data: []byte("1\n!x\n3\n4\n!\n")}}
	shards, err := shard.SplitText(ctx, fsys, []string{"f"}, shard.SplitConfig{RecordsPerShard: 5})
	if err != nil {
		t.Fatal(err)
	}
	for _, seed := range []uint64{0, 5} {
		lease := shard.Lease{Shard: shards[0], ShuffleSeed: seed}
		cur, err := shard.TextSource{FS: fsys, Parser: labelParser{}}.Open(ctx, lease)
		if err != nil {
			t.Fatal(err)
		}
		var rec shard.Record
		var pe *shard.ParseError
		for {
			err = cur.Next(&rec)
			if err != nil {
				break
			}
		}
		if !errors.As(err, &pe) || pe.File != "f" || (pe.Line != 2 && pe.Line != 5) {
			t.Fatalf("seed %d: want a parse error at f:2 or f:5, got %v", seed, err)
		}
		cur, _ = shard.TextSource{FS: fsys, Parser: labelParser{}, OnError: shard.SkipMalformed}.Open(ctx, lease)
		var offsets []int64
		for cur.Next(&rec) == nil {
			offsets = append(offsets, rec.Offset)
		}
		if len(offsets) != 3 {
			t.Fatalf("seed %d: skip policy kept %v", seed, offsets)
		}
	}
	// The file changed after splitting: fewer or more lines than the shard table says.
	for _, data := range []string{"1\n2\n", "1\n2\n3\n4\n5\n6\n"} {
		changed := fstest.MapFS{"f": {Data: []byte(data)}}
		s := shards[0]
		s.End = int64(len(data))
		for _, seed := range []uint64{0, 5} {
			cur, err := shard.TextSource{FS: changed, Parser: labelParser{}}.Open(ctx, shard.Lease{Shard: s, ShuffleSeed: seed})
			if err == nil {
				var rec shard.Record
				for err == nil {
					err = cur.Next(&rec)
				}
			}
			if !errors.Is(err, shard.ErrShardMismatch) {
				t.Fatalf("%q seed %d: %v", data, seed, err)
			}
		}
	}
}

func TestIndexedSource(t *testing.T) {
	data := shard.IndexedFunc(10, func(i int64, rec *shard.Record) error {
		if i == 3 {
			return &shard.ParseError{Line: i, Err: errors.New("bad")}
		}
		rec.Label = float32(i)
		return nil
	})
	sh := shard.Shard{Kind: shard.KindIndexed, Start: 2, End: 10, Records: 8, Base: 2}
	cur, err := shard.IndexedSource{Data: data, OnError: shard.SkipMalformed}.Open(context.Background(), shard.Lease{Shard: sh, Offset: 0})
	if err != nil {
		t.Fatal(err)
	}
	var rec shard.Record
	var labels []float32
	for cur.Next(&rec) == nil {
		labels = append(labels, rec.Label)
	}
	if len(labels) != 7 || labels[0] != 2 || labels[1] != 4 {
		t.Fatalf("%v", labels)
	}
	cur, _ = shard.IndexedSource{Data: data}.Open(context.Background(), shard.Lease{Shard: sh})
	_ = cur.Next(&rec)
	if err := cur.Next(&rec); !errors.Is(err, shard.ErrMalformed) {
		t.Fatal(err)
	}
	sh.End = 11
	if _, err := (shard.IndexedSource{Data: data}).Open(context.Background(), shard.Lease{Shard: sh}); !errors.Is(err, shard.ErrShardMismatch) {
		t.Fatal(err)
	}
}

func mapFS(name, data string) fstest.MapFS { return fstest.MapFS{name: {Data: []byte(data)}} }
