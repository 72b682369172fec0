package shard

import (
	"bytes"
	"fmt"
)

// LibFM parses the field-aware libFM format as FFM tools (libffm, xLearn) write it: a label
// followed by field:feature:value triples separated by spaces or tabs
// ("1 0:17:1 1:204:1 2:9:0.37"). Fields are numbered from 0; a feature is an unsigned integer
// index; the value weighs the feature (a one-hot feature has value 1, a numeric one its value).
// A '#' starts a comment. The label is read by ParseLabel (0/1 and -1/+1 alike); a line with a
// label and no feature, a field at or beyond Fields, or a value that is not a finite number makes
// the line malformed.
//
// Records get Label, no dense features, and Fields sparse fields named F0, F1, ...: each holds
// the features of its field (any number, in the order written, whatever order the fields come
// in) as ids with their values in Values, for a trainer to use as multipliers of the embedding
// rows (value × row) pooled per field.
type LibFM struct {
	// Fields is the number of fields; field indices run from 0 to Fields-1. Required: between 1
	// and MaxFields (LibFMFields finds it in a sample of lines).
	Fields int
}

var _ Parser = LibFM{}

// Schema returns no dense features and Fields fields named F0..F<Fields-1>.
func (p LibFM) Schema() Schema {
	f := make([]string, p.Fields)
	for i := range f {
		f[i] = fmt.Sprintf("F%d", i)
	}
	return Schema{Fields: f}
}

// Parse implements Parser.
func (p LibFM) Parse(line []byte, rec *Record) error {
	if p.Fields < 1 || p.Fields > MaxFields {
		return fmt.Errorf("%w: LibFM.Fields %d outside [1, %d]", ErrInvalidConfig, p.Fields, MaxFields)
	}
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
		c1 := bytes.IndexByte(tok, ':')
		c2 := -1
		if c1 >= 0 {
			if j := bytes.IndexByte(tok[c1+1:], ':'); j >= 0 {
				c2 = c1 + 1 + j
			}
		}
		if c2 < 0 {
			return fmt.Errorf("feature %q is not field:feature:value", clip(tok))
		}
		field, err := parseUint64(tok[:c1])
		if err != nil {
			return fmt.Errorf("field %q: %w", clip(tok[:c1]), err)
		}
		if field >= uint64(p.Fields) {
			return fmt.Errorf("field %d beyond the %d fields (0 to %d)", field, p.Fields, p.Fields-1)
		}
		feat, err := parseUint64(tok[c1+1 : c2])
		if err != nil {
			return fmt.Errorf("field %d feature %q: %w", field, clip(tok[c1+1:c2]), err)
		}
		val, err := parseFloat32(tok[c2+1:])
		if err != nil {
			return fmt.Errorf("field %d feature %d value %q: %w", field, feat, clip(tok[c2+1:]), err)
		}
		rec.fieldOf = append(rec.fieldOf, int32(field))
		rec.IDs = append(rec.IDs, feat)
		rec.Values = append(rec.Values, val)
	}
	if len(rec.IDs) == 0 {
		return errNoFeatures
	}
	rec.groupFields(p.Fields)
	return nil
}

// LibFMFields returns the number of fields the libFM lines in data use: one more than the
// highest field index of a well-formed field:feature:value token, or 0 if there is none. A
// trainer that is not told the field count reads it from the first lines of its files.
func LibFMFields(data []byte) int {
	highest := -1
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if i := bytes.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		_, line = nextToken(trimCR(line)) // the label
		for {
			var tok []byte
			if tok, line = nextToken(line); len(tok) == 0 {
				break
			}
			c1 := bytes.IndexByte(tok, ':')
			if c1 < 0 || bytes.IndexByte(tok[c1+1:], ':') < 0 {
				continue
			}
			if f, err := parseUint64(tok[:c1]); err == nil && f < MaxFields {
				highest = max(highest, int(f))
			}
		}
	}
	return highest + 1
}
