package shard

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// Source opens the records of a leased shard. Implementations here: IndexedSource (in-memory
// data sets) and TextSource (text files); a stream source (a message queue client) is the
// application's. A Source must be safe for concurrent Open calls.
type Source interface {
	// Open returns a cursor at lease.Offset of the lease's shard, visiting records in the order
	// given by lease.ShuffleSeed (see RecordOrder).
	Open(ctx context.Context, lease Lease) (Cursor, error)
}

// Cursor yields the records of one shard from some offset on. Not safe for concurrent use.
type Cursor interface {
	// Next fills rec (resetting it) with the next record and sets rec.Offset to its position in
	// the shard. It returns io.EOF after the last record. Offsets are increasing; a gap is a
	// malformed record the cursor skipped. A *ParseError means a malformed record under
	// FailOnMalformed: the cursor cannot go on.
	Next(rec *Record) error
	// Close releases the cursor's resources.
	Close() error
}

// Indexed is a data set addressed by record index: the records of a KindIndexed dataset.
type Indexed interface {
	// Len returns the number of records.
	Len() int64
	// ReadRecord fills rec (resetting it) with record i, 0 <= i < Len(). It may be called
	// concurrently.
	ReadRecord(i int64, rec *Record) error
}

// IndexedFunc adapts a function to Indexed: n records, record i made by fn.
func IndexedFunc(n int64, fn func(i int64, rec *Record) error) Indexed { return indexedFunc{n, fn} }

type indexedFunc struct {
	n  int64
	fn func(int64, *Record) error
}

func (f indexedFunc) Len() int64 { return f.n }
func (f indexedFunc) ReadRecord(i int64, rec *Record) error {
	rec.Reset()
	return f.fn(i, rec)
}

// IndexedSource serves KindIndexed shards from an Indexed data set.
type IndexedSource struct {
	Data Indexed
	// OnError applies when ReadRecord returns an error matching ErrMalformed.
	OnError ErrorPolicy
}

var _ Source = IndexedSource{}

// Open implements Source.
func (s IndexedSource) Open(ctx context.Context, l Lease) (Cursor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sh := l.Shard
	if sh.Kind != KindIndexed {
		return nil, fmt.Errorf("shard: an indexed source given a shard of kind %v", sh.Kind)
	}
	if sh.End > s.Data.Len() {
		return nil, fmt.Errorf("%w: shard %d ends at record %d, data set has %d", ErrShardMismatch, sh.Index, sh.End, s.Data.Len())
	}
	c := &indexedCursor{src: s, shard: sh, pos: l.Offset}
	if l.ShuffleSeed != 0 {
		c.order = RecordOrder(l.ShuffleSeed, sh.Records)
	}
	return c, nil
}

type indexedCursor struct {
	src   IndexedSource
	shard Shard
	order []int32
	pos   int64
}

func (c *indexedCursor) Next(rec *Record) error {
	for c.pos < c.shard.Records {
		pos := c.pos
		c.pos++
		i := pos
		if c.order != nil {
			i = int64(c.order[pos])
		}
		if err := c.src.Data.ReadRecord(c.shard.Start+i, rec); err != nil {
			if c.src.OnError == SkipMalformed && errors.Is(err, ErrMalformed) {
				continue
			}
			return err
		}
		rec.Offset = pos
		return nil
	}
	return io.EOF
}

func (c *indexedCursor) Close() error { return nil }

// TextSource serves KindText shards: it reads the shard's byte range of its file from FS and
// parses each line. Files that implement io.Seeker (os and testing/fstest files do) are seeked
// to the range; others are read from their start.
//
// With Bad set, every malformed line is counted there (per file, each line once) and Bad's
// policy may stop the reading: the cursor, and every cursor and Open of every source sharing
// Bad after it, then fails with its *BadLinesError. Under FailOnMalformed the first malformed
// line stops it so. Without Bad, skipped lines are only counted by the Reader (Batch.Skipped).
type TextSource struct {
	FS      fs.FS
	Parser  Parser
	OnError ErrorPolicy
	Bad     *BadLines
}

var _ Source = TextSource{}

// Open implements Source. Without a ShuffleSeed it streams the range; with one it reads the
// whole range into memory to visit its lines in the shuffled order.
func (s TextSource) Open(ctx context.Context, l Lease) (Cursor, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sh := l.Shard
	if sh.Kind != KindText {
		return nil, fmt.Errorf("shard: a text source given a shard of kind %v", sh.Kind)
	}
	f, err := s.FS.Open(sh.File)
	if err != nil {
		return nil, fmt.Errorf("shard: open shard %d: %w", sh.Index, err)
	}
	if seeker, ok := f.(io.Seeker); ok {
		_, err = seeker.Seek(sh.Start, io.SeekStart)
	} else {
		_, err = io.CopyN(io.Discard, f, sh.Start)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("shard: seek %s to %d: %w", sh.File, sh.Start, err)
	}
	c := &textCursor{src: s, shard: sh, f: f, pos: l.Offset}
	if s.Bad != nil {
		if _, err := s.Bad.open(sh); err != nil {
			_ = f.Close()
			return nil, err
		}
	}
	r := io.LimitReader(f, sh.End-sh.Start)
	if l.ShuffleSeed == 0 {
		c.br = bufio.NewReaderSize(r, 64<<10)
		for range l.Offset { // skip what was already trained
			if _, err := c.readLine(); err != nil {
				_ = f.Close()
				return nil, err
			}
		}
		return c, nil
	}
	c.data, err = io.ReadAll(r)
	_ = f.Close()
	c.f = nil
	if err != nil {
		return nil, fmt.Errorf("shard: read %s: %w", sh.File, err)
	}
	for i := 0; i < len(c.data); {
		c.starts = append(c.starts, int32(i))
		j := bytes.IndexByte(c.data[i:], '\n')
		if j < 0 {
			break
		}
		i += j + 1
	}
	if int64(len(c.starts)) != sh.Records {
		return nil, fmt.Errorf("%w: %s [%d, %d) holds %d lines, shard %d has %d records", ErrShardMismatch, sh.File, sh.Start, sh.End, len(c.starts), sh.Index, sh.Records)
	}
	c.order = RecordOrder(l.ShuffleSeed, sh.Records)
	return c, nil
}

type textCursor struct {
	src   TextSource
	shard Shard
	f     fs.File
	pos   int64 // next position to visit
	// Streaming mode.
	br   *bufio.Reader
	long []byte
	// Shuffled mode: the range in memory.
	data   []byte
	starts []int32
	order  []int32
	good   bool // a well-formed line was read (and told to src.Bad)
}

// readLine returns the next line of the range in streaming mode.
func (c *textCursor) readLine() ([]byte, error) {
	c.long = c.long[:0]
	for {
		chunk, err := c.br.ReadSlice('\n')
		switch err {
		case nil:
			if len(c.long) > 0 {
				return append(c.long, chunk[:len(chunk)-1]...), nil
			}
			return chunk[:len(chunk)-1], nil
		case bufio.ErrBufferFull:
			c.long = append(c.long, chunk...)
			if len(c.long) > maxLine {
				return nil, &ParseError{File: c.shard.File, Line: c.shard.Line + c.pos, Err: errLongLine}
			}
		case io.EOF:
			line := append(c.long, chunk...)
			if len(line) == 0 {
				return nil, io.EOF
			}
			return line, nil
		default:
			return nil, fmt.Errorf("shard: read %s: %w", c.shard.File, err)
		}
	}
}

func (c *textCursor) Next(rec *Record) error {
	for c.pos < c.shard.Records {
		pos := c.pos
		var line []byte
		lineNo := c.shard.Line + pos
		if c.order == nil {
			var err error
			if line, err = c.readLine(); err == io.EOF {
				return fmt.Errorf("%w: %s [%d, %d) ends after %d of %d records of shard %d", ErrShardMismatch, c.shard.File, c.shard.Start, c.shard.End, pos, c.shard.Records, c.shard.Index)
			} else if err != nil {
				return err
			}
		} else {
			i := c.order[pos]
			lineNo = c.shard.Line + int64(i)
			start, end := int(c.starts[i]), len(c.data)
			if int(i)+1 < len(c.starts) {
				end = int(c.starts[i+1]) - 1
			} else if end > start && c.data[end-1] == '\n' {
				end--
			}
			line = c.data[start:end]
		}
		c.pos++
		rec.Reset()
		if err := c.src.Parser.Parse(line, rec); err != nil {
			perr := &ParseError{File: c.shard.File, Line: lineNo, Err: err}
			fail := c.src.OnError != SkipMalformed
			if bad := c.src.Bad; bad != nil {
				if err := bad.bad(c.shard, pos, perr, fail); err != nil {
					return err
				}
			}
			if !fail {
				continue
			}
			return perr
		}
		if bad := c.src.Bad; bad != nil {
			if bad.stop.Load() {
				return bad.Err()
			}
			if !c.good {
				c.good = true
				bad.good(c.shard.File)
			}
		}
		rec.Offset = pos
		return nil
	}
	if c.order == nil {
		if _, err := c.readLine(); err != io.EOF {
			return fmt.Errorf("%w: %s [%d, %d) holds more than the %d records of shard %d", ErrShardMismatch, c.shard.File, c.shard.Start, c.shard.End, c.shard.Records, c.shard.Index)
		}
	}
	return io.EOF
}

func (c *textCursor) Close() error {
	if c.src.Bad != nil {
		c.src.Bad.examinedTo(c.shard, c.pos)
	}
	if c.f == nil {
		return nil
	}
	err := c.f.Close()
	c.f = nil
	return err
}
