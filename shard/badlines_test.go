package shard_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/elasticps/elasticps/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readAll reads every shard of src once, as a worker would, and returns the records read and
// the first error.
func readAll(t *testing.T, src shard.Source, shards []shard.Shard) (int, error) {
	t.Helper()
	n := 0
	var rec shard.Record
	for _, s := range shards {
		c, err := src.Open(context.Background(), shard.Lease{Shard: s})
		if err != nil {
			return n, err
		}
		for {
			err := c.Next(&rec)
			if err == io.EOF {
				break
			}
			if err != nil {
				c.Close()
				return n, err
			}
			n++
		}
		c.Close()
	}
	return n, nil
}

// libsvmFile writes n lines of which the lines whose 1-based number bad says are malformed.
func libsvmFile(n int, bad func(line int) bool) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		if bad(i) {
			fmt.Fprintf(&b, "%d nan:1\n", i%2)
		} else {
			fmt.Fprintf(&b, "%d %d:1\n", i%2, i)
		}
	}
	return b.String()
}

func split(t *testing.T, fsys fstest.MapFS, files ...string) []shard.Shard {
	t.Helper()
	shards, err := shard.SplitText(context.Background(), fsys, files, shard.SplitConfig{RecordsPerShard: 7})
	require.NoError(t, err)
	return shards
}

func TestBadLinesCountedOncePerFileWithTheirLines(t *testing.T) {
	fsys := fstest.MapFS{
		"a.svm": {Data: []byte(libsvmFile(300, func(l int) bool { return l == 5 || l == 123 }))},
		"b.svm": {Data: []byte(libsvmFile(200, func(l int) bool { return l == 200 }))},
	}
	shards := split(t, fsys, "a.svm", "b.svm")
	bad := shard.NewBadLines(shard.BadLinesConfig{}, shards)
	bad.Name = func(f string) string { return "/data/" + f }
	src := shard.TextSource{FS: fsys, Parser: shard.LibSVM{}, OnError: shard.SkipMalformed, Bad: bad}
	for epoch := range 3 { // read again: nothing is counted twice
		n, err := readAll(t, src, shards)
		require.NoError(t, err, "epoch %d", epoch)
		assert.Equal(t, 497, n)
	}
	// A lease taken over from position 3 of the first shard of b: its line 200 is not new.
	last := shards[len(shards)-1]
	c, err := src.Open(context.Background(), shard.Lease{Shard: last, Offset: 3})
	require.NoError(t, err)
	for err == nil {
		err = c.Next(&shard.Record{})
	}
	require.ErrorIs(t, err, io.EOF)
	c.Close()

	r := bad.Report()
	require.NoError(t, r.Err)
	assert.Equal(t, []shard.FileBadLines{{File: "/data/a.svm", Lines: 300, Bad: 2}, {File: "/data/b.svm", Lines: 200, Bad: 1}}, r.Files)
	assert.Equal(t, int64(3), r.Bad)
	require.Len(t, r.Examples, 3)
	var where []string
	for _, e := range r.Examples {
		where = append(where, fmt.Sprintf("%s:%d", e.File, e.Line))
	}
	assert.Equal(t, []string{"/data/a.svm:5", "/data/a.svm:123", "/data/b.svm:200"}, where, "file names and 1-based line numbers")
	assert.Contains(t, r.Examples[0].Err.Error(), "feature index")
}

func TestBadLinesPolicyStopsTheReading(t *testing.T) {
	t.Run("more than the share of a file", func(t *testing.T) {
		// 4 bad lines of 300 is 1.3 %: the fourth stops it, whichever shard it is in.
		fsys := fstest.MapFS{"a.svm": {Data: []byte(libsvmFile(300, func(l int) bool { return l%70 == 0 }))}}
		shards := split(t, fsys, "a.svm")
		bad := shard.NewBadLines(shard.BadLinesConfig{}, shards)
		src := shard.TextSource{FS: fsys, Parser: shard.LibSVM{}, OnError: shard.SkipMalformed, Bad: bad}
		n, err := readAll(t, src, shards)
		require.ErrorIs(t, err, shard.ErrTooManyBadLines)
		assert.ErrorIs(t, err, shard.ErrMalformed)
		var be *shard.BadLinesError
		require.ErrorAs(t, err, &be)
		assert.Equal(t, int64(4), be.Bad)
		assert.Equal(t, 276, n, "lines 1 to 280 read, 3 of them bad")
		assert.Contains(t, err.Error(), "a.svm:70: ")
		assert.Contains(t, err.Error(), "more than 1% of its lines")
		// Every later Open fails with the same reason.
		_, err = src.Open(context.Background(), shard.Lease{Shard: shards[0]})
		assert.ErrorIs(t, err, shard.ErrTooManyBadLines)
		assert.Equal(t, err, bad.Err())
	})
	t.Run("a share allowed", func(t *testing.T) {
		fsys := fstest.MapFS{"a.svm": {Data: []byte(libsvmFile(300, func(l int) bool { return l%70 == 0 }))}}
		shards := split(t, fsys, "a.svm")
		bad := shard.NewBadLines(shard.BadLinesConfig{MaxFraction: 0.02}, shards)
		_, err := readAll(t, shard.TextSource{FS: fsys, Parser: shard.LibSVM{}, OnError: shard.SkipMalformed, Bad: bad}, shards)
		require.NoError(t, err)
		assert.Equal(t, int64(4), bad.Report().Bad)
	})
	t.Run("the first lines all bad", func(t *testing.T) {
		// A comma-separated file given as Criteo: stopped after HeadLines lines, not at its end.
		var b strings.Builder
		for i := range 100000 {
			fmt.Fprintf(&b, "%d,1,2,3,abc\n", i%2)
		}
		fsys := fstest.MapFS{"x.csv": {Data: []byte(b.String())}}
		shards := split(t, fsys, "x.csv")
		bad := shard.NewBadLines(shard.BadLinesConfig{MaxFraction: 0.5, HeadLines: 50}, shards)
		n, err := readAll(t, shard.TextSource{FS: fsys, Parser: shard.Criteo{}, OnError: shard.SkipMalformed, Bad: bad}, shards)
		require.ErrorIs(t, err, shard.ErrTooManyBadLines)
		assert.Zero(t, n)
		assert.Contains(t, err.Error(), "the first 50 lines read are all malformed")
		assert.Contains(t, err.Error(), "x.csv:1: no tab but commas")
	})
	t.Run("fail on the first", func(t *testing.T) {
		fsys := fstest.MapFS{"a.svm": {Data: []byte(libsvmFile(300, func(l int) bool { return l == 150 }))}}
		shards := split(t, fsys, "a.svm")
		bad := shard.NewBadLines(shard.BadLinesConfig{}, shards)
		n, err := readAll(t, shard.TextSource{FS: fsys, Parser: shard.LibSVM{}, OnError: shard.FailOnMalformed, Bad: bad}, shards)
		require.ErrorIs(t, err, shard.ErrTooManyBadLines)
		assert.Equal(t, 149, n)
		assert.Contains(t, err.Error(), "a.svm:150: ")
		var pe *shard.ParseError
		assert.False(t, errors.As(err, &pe), "the policy's error, naming the line among its examples")
	})
}
