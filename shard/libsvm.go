package shard

import (
	"bytes"
	"fmt"
)

// LibSVM parses the libSVM / libFM text format: a label followed by idx:val pairs separated by
// spaces or tabs ("1 3:1 10:0.5 2049:1"). Tokens "qid:..." are ignored and a '#' starts a
// comment to the end of the line.
//
// Records get Label, no dense features and a single sparse field holding the indices as feature
// ids (unhashed: they are already integers), with Values holding their values. The zero value
// keeps labels as written.
type LibSVM struct {
	// Binarize maps labels to 1 when > 0 and 0 otherwise (for -1/+1 files fed to a logistic
	// loss).
	Binarize bool
}

var _ Parser = LibSVM{}

// Schema returns no dense features and one field named "features".
func (LibSVM) Schema() Schema { return Schema{Fields: []string{"features"}} }

// Parse implements Parser.
func (p LibSVM) Parse(line []byte, rec *Record) error {
	line = trimCR(line)
	if i := bytes.IndexByte(line, '#'); i >= 0 {
		line = line[:i]
	}
	first := true
	for len(line) > 0 {
		// Skip separators, then cut a token.
		for len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
			line = line[1:]
		}
		if len(line) == 0 {
			break
		}
		end := 0
		for end < len(line) && line[end] != ' ' && line[end] != '\t' {
			end++
		}
		tok := line[:end]
		line = line[end:]
		if first {
			v, err := parseFloat32(tok)
			if err != nil {
				return fmt.Errorf("label %q: %w", tok, err)
			}
			if p.Binarize {
				v = float32(boolByte(v > 0))
			}
			rec.Label = v
			first = false
			continue
		}
		colon := bytes.IndexByte(tok, ':')
		if colon < 0 {
			return fmt.Errorf("feature %q is not idx:val", tok)
		}
		if string(tok[:colon]) == "qid" {
			continue
		}
		idx, err := parseUint64(tok[:colon])
		if err != nil {
			return fmt.Errorf("feature index %q: %w", tok[:colon], err)
		}
		val, err := parseFloat32(tok[colon+1:])
		if err != nil {
			return fmt.Errorf("feature value %q: %w", tok[colon+1:], err)
		}
		rec.IDs = append(rec.IDs, idx)
		rec.Values = append(rec.Values, val)
	}
	if first {
		return fmt.Errorf("empty line")
	}
	rec.EndField()
	return nil
}
