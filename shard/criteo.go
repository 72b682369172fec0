package shard

import (
	"bytes"
	"errors"
	"fmt"
	"math"
)

// Criteo column counts: a label, 13 integer features and 26 categorical features.
const (
	CriteoDense  = 13
	CriteoFields = 26
)

// Criteo parses the Criteo display-advertising TSV format (Kaggle and Terabyte): a label, 13
// integer columns and 26 categorical columns of hexadecimal strings, tab separated. Any
// feature column may be empty.
//
// Records get Label = the label column read by ParseLabel (0/1 or -1/+1), Dense = the 13 integers (empty = 0), by default
// transformed as log(1 + max(x, 0)) as DLRM does, and one sparse field per categorical column
// holding FeatureID(field, hex) or no id when the column is empty. The zero value is ready.
type Criteo struct {
	// RawDense keeps the integers as they are instead of log(1 + max(x, 0)).
	RawDense bool
}

var _ Parser = Criteo{}

// Schema returns 13 dense features and 26 fields named C1..C26.
func (Criteo) Schema() Schema {
	f := make([]string, CriteoFields)
	for i := range f {
		f[i] = fmt.Sprintf("C%d", i+1)
	}
	return Schema{Dense: CriteoDense, Fields: f}
}

// Parse implements Parser.
func (p Criteo) Parse(line []byte, rec *Record) error {
	line = trimCR(line)
	col := 0
	for {
		i := bytes.IndexByte(line, '\t')
		field := line
		if i >= 0 {
			field = line[:i]
		}
		switch {
		case col == 0:
			if i < 0 && bytes.IndexByte(line, ',') >= 0 {
				return errCommaSeparated
			}
			v, err := ParseLabel(field)
			if err != nil {
				return fmt.Errorf("label %q: %w", clip(field), err)
			}
			rec.Label = v
		case col <= CriteoDense:
			var x float32
			if len(field) > 0 {
				v, err := parseInt64(field)
				if err != nil {
					return fmt.Errorf("integer column I%d %q: %w", col, field, err)
				}
				if p.RawDense {
					x = float32(v)
				} else {
					// 1+v is exact for these integers, so Log(1+v) is as good as Log1p(v), and faster.
					x = float32(math.Log(1 + float64(max(v, 0))))
				}
			}
			rec.Dense = append(rec.Dense, x)
		case col <= CriteoDense+CriteoFields:
			if len(field) > 0 {
				if len(field) > 16 || !isHex(field) {
					return fmt.Errorf("categorical column C%d %q is not hexadecimal", col-CriteoDense, field)
				}
				rec.IDs = append(rec.IDs, FeatureID(col-CriteoDense-1, field))
			}
			rec.EndField()
		default:
			return fmt.Errorf("more than %d columns", 1+CriteoDense+CriteoFields)
		}
		col++
		if i < 0 {
			break
		}
		line = line[i+1:]
	}
	if col != 1+CriteoDense+CriteoFields {
		return fmt.Errorf("%d columns, want %d", col, 1+CriteoDense+CriteoFields)
	}
	return nil
}

// errCommaSeparated is the reason given for a line with commas and no tab: a CSV file given as
// Criteo TSV fails on its first line with a reason that says so.
var errCommaSeparated = errors.New("no tab but commas: a comma-separated line, and Criteo columns are tab-separated")

// clip shortens a field quoted in an error to 32 bytes.
func clip(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}

func isHex(b []byte) bool {
	for _, c := range b {
		// Unsigned wrap-around makes each range test one comparison; c|0x20 folds A-F to a-f.
		if c-'0' >= 10 && (c|0x20)-'a' >= 6 {
			return false
		}
	}
	return true
}
