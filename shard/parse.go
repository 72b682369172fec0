package shard

import (
	"errors"
	"math"
	"strconv"
	"unsafe"
)

// Parser decodes one text line into a Record. Implementations in this package: Criteo, LibSVM,
// LibFM and MovieLensRatings. Parsers are safe for concurrent use (they hold no per-call state).
type Parser interface {
	// Parse decodes line (without its line ending) into rec, which the caller has Reset. An error
	// describes what is wrong with the line; the caller adds the file and line number.
	Parse(line []byte, rec *Record) error
	// Schema returns the shape of the records Parse produces.
	Schema() Schema
}

// ErrorPolicy says what a source does with a malformed line.
type ErrorPolicy uint8

const (
	// FailOnMalformed stops reading with a *ParseError (the default).
	FailOnMalformed ErrorPolicy = iota
	// SkipMalformed drops the line, counts it (Batch.Skipped, ReaderStats.Skipped) and goes on.
	// The line's offset still counts as trained when its batch is reported.
	SkipMalformed
)

var (
	errEmptyNumber = errors.New("empty number")
	errBadNumber   = errors.New("bad number")
	errNonFinite   = errors.New("not a finite number")
)

// bytesString views b as a string without copying; the string must not outlive the call that
// uses it (strconv errors, which keep their input, are dropped by the callers below).
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// parseFloat32 parses a finite decimal or scientific float: NaN, ±Inf and values beyond
// float32's range are errors (a feature value or label that is not a number is a bad line).
func parseFloat32(b []byte) (float32, error) {
	if len(b) == 0 {
		return 0, errEmptyNumber
	}
	v, err := strconv.ParseFloat(bytesString(b), 32)
	if err != nil {
		return 0, errBadNumber
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, errNonFinite
	}
	return float32(v), nil
}

// ParseLabel reads a click label the one way every parser of this package does: "1", "+1" (or
// any number equal to 1) is a click, "0" and "-1" are not, so 0/1 files and -1/+1 files mean the
// same; a value strictly between 0 and 1 is kept as a soft label. Anything else — another
// number, NaN, ±Inf, a word — is an error: the line is malformed.
func ParseLabel(b []byte) (float32, error) {
	switch string(b) { // the common spellings without a float parse
	case "0", "-1":
		return 0, nil
	case "1", "+1":
		return 1, nil
	}
	v, err := parseFloat32(b)
	switch {
	case err != nil:
		return 0, err
	case v == -1 || v == 0:
		return 0, nil
	case v >= 0 && v <= 1:
		return v, nil
	}
	return 0, errLabelRange
}

var errLabelRange = errors.New("not a click label (want 0 or 1, -1 or +1, or a probability in between)")

// parseInt64 parses an optionally signed decimal integer.
func parseInt64(b []byte) (int64, error) {
	if len(b) == 0 {
		return 0, errEmptyNumber
	}
	neg := b[0] == '-'
	if neg || b[0] == '+' {
		b = b[1:]
		if len(b) == 0 {
			return 0, errBadNumber
		}
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' || v > (1<<63-1)/10 {
			return 0, errBadNumber
		}
		v = v*10 + uint64(c-'0')
	}
	if v > 1<<63-1 {
		return 0, errBadNumber
	}
	if neg {
		return -int64(v), nil
	}
	return int64(v), nil
}

// parseUint64 parses an unsigned decimal integer.
func parseUint64(b []byte) (uint64, error) {
	if len(b) == 0 {
		return 0, errEmptyNumber
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, errBadNumber
		}
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, errBadNumber
		}
		v = v*10 + d
	}
	return v, nil
}

// trimCR drops a trailing carriage return (CRLF files).
func trimCR(line []byte) []byte {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		return line[:n-1]
	}
	return line
}
