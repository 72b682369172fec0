package shard

import (
	"bytes"
	"errors"
	"fmt"
)

// LibSVM parses the plain libSVM text format: a label followed by idx:val pairs separated by
// spaces or tabs ("1 3:1 10:0.5 2049:1"). Tokens "qid:..." are ignored and a '#' starts a
// comment to the end of the line. The label is read by ParseLabel (0/1 and -1/+1 alike); a line
// with a label and no feature is malformed, and so is a value that is not a finite number.
//
// Records get Label, no dense features, the indices as feature ids (unhashed: they are already
// integers) and Values holding their values. Without Fields every feature lands in one sparse
// field named "features", which a DLRM can only pool into one vector: a logistic regression in
// effect. With Fields each index goes to the field the map gives it (see FieldMap), and an index
// the map does not cover makes the line malformed. The zero value is ready.
type LibSVM struct {
	// Fields optionally maps feature index ranges to fields. Nil: one field.
	Fields *FieldMap
}

var _ Parser = LibSVM{}

// Schema returns no dense features and the fields of the map, or one field named "features".
func (p LibSVM) Schema() Schema {
	if p.Fields == nil {
		return Schema{Fields: []string{"features"}}
	}
	return Schema{Fields: p.Fields.Names()}
}

var errNoFeatures = errors.New("a label and no feature")

// Parse implements Parser.
func (p LibSVM) Parse(line []byte, rec *Record) error {
	line, label, err := cutLabel(line)
	if err != nil {
		return err
	}
	rec.Label = label
	for len(line) > 0 {
		var tok []byte
		tok, line = nextToken(line)
		if len(tok) == 0 {
			break
		}
		colon := bytes.IndexByte(tok, ':')
		if colon < 0 {
			return fmt.Errorf("feature %q is not idx:val", clip(tok))
		}
		if string(tok[:colon]) == "qid" {
			continue
		}
		idx, err := parseUint64(tok[:colon])
		if err != nil {
			return fmt.Errorf("feature index %q: %w", clip(tok[:colon]), err)
		}
		val, err := parseFloat32(tok[colon+1:])
		if err != nil {
			return fmt.Errorf("feature %d value %q: %w", idx, clip(tok[colon+1:]), err)
		}
		if p.Fields != nil {
			f, ok := p.Fields.Field(idx)
			if !ok {
				return fmt.Errorf("feature index %d is in no field of the field map", idx)
			}
			rec.fieldOf = append(rec.fieldOf, int32(f))
		}
		rec.IDs = append(rec.IDs, idx)
		rec.Values = append(rec.Values, val)
	}
	if len(rec.IDs) == 0 {
		return errNoFeatures
	}
	if p.Fields == nil {
		rec.EndField()
		return nil
	}
	rec.groupFields(len(p.Fields.names))
	return nil
}

// cutLabel drops a trailing CR and a '#' comment, reads the label (ParseLabel) and returns the
// rest of the line.
func cutLabel(line []byte) (rest []byte, label float32, err error) {
	line = trimCR(line)
	if i := bytes.IndexByte(line, '#'); i >= 0 {
		line = line[:i]
	}
	tok, line := nextToken(line)
	if len(tok) == 0 {
		return nil, 0, errors.New("empty line")
	}
	if label, err = ParseLabel(tok); err != nil {
		return nil, 0, fmt.Errorf("label %q: %w", clip(tok), err)
	}
	return line, label, nil
}

// nextToken skips spaces and tabs and cuts the next token; tok is empty at the end of line.
func nextToken(line []byte) (tok, rest []byte) {
	for len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
		line = line[1:]
	}
	end := 0
	for end < len(line) && line[end] != ' ' && line[end] != '\t' {
		end++
	}
	return line[:end], line[end:]
}
