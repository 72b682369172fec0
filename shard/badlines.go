package shard

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
)

// ErrTooManyBadLines is matched by the *BadLinesError a TextSource with a BadLines returns once
// its policy says the input is not worth reading on.
var ErrTooManyBadLines = errors.New("shard: too many malformed lines")

// BadLinesConfig is the policy of a BadLines. The zero value of every field means its default.
type BadLinesConfig struct {
	// MaxFraction stops reading when more than this share of a file's lines is malformed: its
	// bad lines exceed MaxFraction × its line count (known from the split, so the test is exact
	// as soon as it holds, however few lines were read). Default 0.01; 1 or more never stops.
	MaxFraction float64
	// HeadLines stops reading when the first HeadLines lines read of a file are all malformed
	// (a file of another format: stop before reading on through it). Default 1000.
	HeadLines int64
	// Examples is how many bad lines are kept with their place and reason. Default 5.
	Examples int
}

func (c *BadLinesConfig) fill() {
	if c.MaxFraction == 0 {
		c.MaxFraction = 0.01
	}
	if c.HeadLines == 0 {
		c.HeadLines = 1000
	}
	if c.Examples == 0 {
		c.Examples = 5
	}
}

// FileBadLines is one file's count of lines and of malformed lines.
type FileBadLines struct {
	File  string
	Lines int64 // lines of the file (records of its shards)
	Bad   int64 // malformed lines found so far, each counted once
}

// BadLinesReport is what a BadLines found.
type BadLinesReport struct {
	// Files lists every file of the shards, in the order given, with its bad lines.
	Files []FileBadLines
	// Bad is the sum of the files' bad lines.
	Bad int64
	// Examples are the first bad lines found (up to BadLinesConfig.Examples), with file and 1-based line.
	Examples []*ParseError
	// Err is the *BadLinesError that stopped reading, or nil.
	Err error
}

// BadLinesError says why a BadLines stopped the reading: which file, how many of its lines are
// bad, and the first bad lines found. It matches ErrTooManyBadLines and ErrMalformed.
type BadLinesError struct {
	File       string
	Bad, Lines int64
	// Reason says which rule stopped reading.
	Reason   string
	Examples []*ParseError
}

func (e *BadLinesError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "shard: %s: %s (%d malformed of its %d lines so far)", e.File, e.Reason, e.Bad, e.Lines)
	for _, x := range e.Examples {
		fmt.Fprintf(&b, "\n  %s:%d: %v", x.File, x.Line, x.Err)
	}
	return b.String()
}

// Is reports whether target is ErrTooManyBadLines or ErrMalformed.
func (e *BadLinesError) Is(target error) bool {
	return target == ErrTooManyBadLines || target == ErrMalformed
}

// BadLines counts the lines TextSources reject, per file, keeps the first few with their place,
// and applies a policy that stops reading when there are too many: more than a share of a file's
// lines, a file whose first lines are all bad, or, for a TextSource whose OnError is
// FailOnMalformed, any. Once it has stopped, every
// cursor of every TextSource sharing it fails at its next line or Open with the same
// *BadLinesError, so that a job's workers all stop with the reason instead of retrying.
//
// A line is counted once however often it is read — again in a later epoch, or by the next holder
// of a lost lease — because each shard keeps the position through which its lines were examined
// and only lines at or past it count. Share one BadLines between the sources of one job (the
// training files and any test files); it is safe for concurrent use.
type BadLines struct {
	cfg BadLinesConfig
	// Name, if set, turns the file names of the shards into the names reports show (a path the
	// user gave rather than the name within an fs.FS). Set it before use.
	Name func(file string) string

	mu       sync.Mutex
	files    []*fileLines
	byName   map[string]*fileLines
	examined map[shardKey]int64 // per shard: positions below are examined
	examples []*ParseError
	stopped  *BadLinesError
	stop     atomic.Bool // stopped != nil, read without the lock on every line
}

type fileLines struct {
	FileBadLines
	good bool // a well-formed line was read
}

type shardKey struct {
	file  string
	start int64
}

// NewBadLines returns a tracker with policy cfg for the files of shards (KindText shards, as
// SplitText cuts them; shards of several splits may be passed together).
func NewBadLines(cfg BadLinesConfig, shards ...[]Shard) *BadLines {
	cfg.fill()
	b := &BadLines{cfg: cfg, byName: map[string]*fileLines{}, examined: map[shardKey]int64{}}
	for _, list := range shards {
		for _, s := range list {
			f := b.byName[s.File]
			if f == nil {
				f = &fileLines{FileBadLines: FileBadLines{File: s.File}}
				b.byName[s.File] = f
				b.files = append(b.files, f)
			}
			f.Lines += s.Records
		}
	}
	return b
}

// Report returns the counts so far.
func (b *BadLines) Report() BadLinesReport {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := BadLinesReport{Examples: b.examplesLocked()}
	for _, f := range b.files {
		fb := f.FileBadLines
		fb.File = b.name(fb.File)
		r.Files = append(r.Files, fb)
		r.Bad += fb.Bad
	}
	if b.stopped != nil {
		r.Err = b.stopped
	}
	return r
}

// Err returns the *BadLinesError that stopped reading, or nil.
func (b *BadLines) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped == nil {
		return nil
	}
	return b.stopped
}

func (b *BadLines) name(file string) string {
	if b.Name == nil {
		return file
	}
	return b.Name(file)
}

// examplesLocked returns copies of the examples with display names.
func (b *BadLines) examplesLocked() []*ParseError {
	out := make([]*ParseError, len(b.examples))
	for i, e := range b.examples {
		out[i] = &ParseError{File: b.name(e.File), Line: e.Line, Err: e.Err}
	}
	return out
}

// open returns the examined position of sh, or the error that stopped reading.
func (b *BadLines) open(sh Shard) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped != nil {
		return 0, b.stopped
	}
	return b.examined[shardKey{sh.File, sh.Start}], nil
}

// examinedTo records that the positions of sh below pos were examined.
func (b *BadLines) examinedTo(sh Shard, pos int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k := shardKey{sh.File, sh.Start}
	b.examined[k] = max(b.examined[k], pos)
}

// good records that file has a well-formed line.
func (b *BadLines) good(file string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f := b.byName[file]; f != nil {
		f.good = true
	}
}

// bad counts the malformed line at position pos of sh (unless it was examined before) and
// returns the error that stops reading, if the policy says to stop now: fail says the first
// bad line does.
func (b *BadLines) bad(sh Shard, pos int64, perr *ParseError, fail bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped != nil {
		return b.stopped
	}
	k := shardKey{sh.File, sh.Start}
	if pos < b.examined[k] && !fail {
		return nil // counted when first read
	}
	b.examined[k] = max(b.examined[k], pos+1)
	f := b.byName[sh.File]
	if f == nil { // a shard the tracker was not given: count it from here on
		f = &fileLines{FileBadLines: FileBadLines{File: sh.File, Lines: sh.Records}}
		b.byName[sh.File] = f
		b.files = append(b.files, f)
	}
	f.Bad++
	if len(b.examples) < b.cfg.Examples {
		b.examples = append(b.examples, perr)
	}
	reason := ""
	switch {
	case fail:
		reason = "a malformed line, and the policy is to fail on the first"
	case float64(f.Bad) > b.cfg.MaxFraction*float64(f.Lines):
		reason = fmt.Sprintf("more than %g%% of its lines are malformed", 100*b.cfg.MaxFraction)
	case !f.good && f.Bad >= b.cfg.HeadLines:
		reason = fmt.Sprintf("the first %d lines read are all malformed", f.Bad)
	default:
		return nil
	}
	b.stopped = &BadLinesError{File: b.name(f.File), Bad: f.Bad, Lines: f.Lines, Reason: reason, Examples: b.examplesLocked()}
	b.stop.Store(true)
	return b.stopped
}
