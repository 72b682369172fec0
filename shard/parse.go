package shard

import (
	"errors"
	"strconv"
	"unsafe"
)

// Parser decodes one text line into a Record. Implementations in this package: Criteo, LibSVM
// and MovieLensRatings. Parsers are safe for concurrent use (they hold no per-call state).
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
)

// bytesString views b as a string without copying; the string must not outlive the call that
// uses it (strconv errors, which keep their input, are dropped by the callers below).
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// parseFloat32 parses a decimal or scientific float.
func parseFloat32(b []byte) (float32, error) {
	if len(b) == 0 {
		return 0, errEmptyNumber
	}
	v, err := strconv.ParseFloat(bytesString(b), 32)
	if err != nil {
		return 0, errBadNumber
	}
	return float32(v), nil
}

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
