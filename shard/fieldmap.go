package shard

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// MaxFields bounds the sparse fields of a FieldMap or a LibFM parser.
const MaxFields = 1 << 10

// ErrFieldMap is returned (wrapped with every problem found) by ParseFieldMap.
var ErrFieldMap = errors.New("shard: bad field map")

// FieldMap assigns libSVM feature indices to named fields by index ranges, so that a plain
// libSVM file whose features are known to come in groups (user ids in one range, item ids in
// another) trains one embedding field per group instead of one field for everything. Fields are
// numbered in the order their names first appear. A FieldMap is immutable and safe for
// concurrent use.
type FieldMap struct {
	names  []string
	ranges []fieldRange // sorted by lo, disjoint
}

type fieldRange struct {
	lo, hi uint64 // inclusive
	field  int
}

// ParseFieldMap reads a field map: entries NAME=LO-HI (an inclusive index range) or NAME=IDX,
// separated by commas or newlines; blank lines and '#' comments are ignored, and a name may
// have several ranges. Ranges must not overlap. Every problem is reported at once.
func ParseFieldMap(text string) (*FieldMap, error) {
	m := &FieldMap{}
	index := map[string]int{}
	var errs []error
	for n, line := range strings.Split(text, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		for _, ent := range strings.Split(line, ",") {
			ent = strings.TrimSpace(ent)
			if ent == "" {
				continue
			}
			name, span, ok := strings.Cut(ent, "=")
			name, span = strings.TrimSpace(name), strings.TrimSpace(span)
			if !ok || name == "" || strings.ContainsAny(name, " \t/") {
				errs = append(errs, fmt.Errorf("line %d: %q is not NAME=LO-HI or NAME=IDX (a name without spaces or '/')", n+1, ent))
				continue
			}
			loS, hiS, isRange := strings.Cut(span, "-")
			if !isRange {
				hiS = loS
			}
			lo, err1 := parseUint64([]byte(strings.TrimSpace(loS)))
			hi, err2 := parseUint64([]byte(strings.TrimSpace(hiS)))
			if err1 != nil || err2 != nil || hi < lo {
				errs = append(errs, fmt.Errorf("line %d: %q: want LO-HI with LO <= HI, or one index", n+1, ent))
				continue
			}
			f, seen := index[name]
			if !seen {
				f = len(m.names)
				index[name] = f
				m.names = append(m.names, name)
			}
			m.ranges = append(m.ranges, fieldRange{lo: lo, hi: hi, field: f})
		}
	}
	sort.Slice(m.ranges, func(i, j int) bool { return m.ranges[i].lo < m.ranges[j].lo })
	for i := 1; i < len(m.ranges); i++ {
		a, b := m.ranges[i-1], m.ranges[i]
		if b.lo <= a.hi {
			errs = append(errs, fmt.Errorf("ranges %d-%d (%s) and %d-%d (%s) overlap", a.lo, a.hi, m.names[a.field], b.lo, b.hi, m.names[b.field]))
		}
	}
	if len(m.names) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("no field"))
	}
	if len(m.names) > MaxFields {
		errs = append(errs, fmt.Errorf("%d fields, at most %d", len(m.names), MaxFields))
	}
	if len(errs) > 0 {
		return nil, errors.Join(append([]error{ErrFieldMap}, errs...)...)
	}
	return m, nil
}

// Names returns the field names in field order (a fresh slice).
func (m *FieldMap) Names() []string { return append([]string(nil), m.names...) }

// Field returns the field of feature index idx, or false when no range holds it.
func (m *FieldMap) Field(idx uint64) (int, bool) {
	i := sort.Search(len(m.ranges), func(i int) bool { return m.ranges[i].hi >= idx })
	if i == len(m.ranges) || m.ranges[i].lo > idx {
		return 0, false
	}
	return m.ranges[i].field, true
}

// String returns the map in the form ParseFieldMap reads, ranges in index order.
func (m *FieldMap) String() string {
	parts := make([]string, len(m.ranges))
	for i, r := range m.ranges {
		if r.lo == r.hi {
			parts[i] = fmt.Sprintf("%s=%d", m.names[r.field], r.lo)
		} else {
			parts[i] = fmt.Sprintf("%s=%d-%d", m.names[r.field], r.lo, r.hi)
		}
	}
	return strings.Join(parts, ",")
}
