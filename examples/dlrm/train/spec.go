package train

import (
	"errors"
	"fmt"
	"strings"
)

// DataKind names where the training records come from.
type DataKind uint8

const (
	// Synthetic is the embedded Criteo-like generator (model.Synth): no files needed.
	Synthetic DataKind = iota
	// Criteo is the Criteo display-advertising TSV format (Kaggle or Terabyte), one or more files.
	Criteo
	// LibSVM is the libSVM / libFM text format, one or more files.
	LibSVM
	// MovieLens is a MovieLens directory holding ratings.csv and movies.csv (or the 100K
	// layout's u.data and u.item), or one ratings file of either layout (such as the 100K
	// layout's u1.base) with the movies in its directory; label = rating >= 4.
	MovieLens
	// LibFM is the field-aware libFM text format (label field:feature:value ...), one or more
	// files: one embedding table per libFM field.
	LibFM
)

// String returns the name used in -data specifications.
func (k DataKind) String() string {
	switch k {
	case Synthetic:
		return "synthetic"
	case Criteo:
		return "criteo"
	case LibSVM:
		return "libsvm"
	case MovieLens:
		return "movielens"
	case LibFM:
		return "libfm"
	}
	return fmt.Sprintf("DataKind(%d)", uint8(k))
}

// DataSpec says what to train on: a kind and its files (or, for MovieLens, one directory or
// ratings file).
type DataSpec struct {
	Kind  DataKind
	Paths []string
}

// ErrDataSpec is returned (wrapped with the reason) by ParseDataSpec for a specification it
// cannot read.
var ErrDataSpec = errors.New("train: bad data specification")

// ParseDataSpec reads a -data flag value: "" or "synthetic" for the generator,
// "criteo:FILE[,FILE...]", "libsvm:FILE[,FILE...]", "libfm:FILE[,FILE...]" or "movielens:DIR" or "movielens:DIR/RATINGS" (a ratings file such as
// the MovieLens 100K layout's u1.base, with the movies in its directory). Paths are not checked
// here; loading reports missing files.
func ParseDataSpec(s string) (DataSpec, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "synthetic" {
		return DataSpec{Kind: Synthetic}, nil
	}
	kind, rest, ok := strings.Cut(s, ":")
	if !ok {
		return DataSpec{}, fmt.Errorf("%w: %q: want synthetic, criteo:FILE[,FILE...], libsvm:FILE[,FILE...], libfm:FILE[,FILE...], movielens:DIR or movielens:DIR/RATINGS", ErrDataSpec, s)
	}
	var spec DataSpec
	switch kind {
	case "synthetic":
		return DataSpec{}, fmt.Errorf("%w: %q: synthetic takes no files", ErrDataSpec, s)
	case "criteo":
		spec.Kind = Criteo
	case "libsvm":
		spec.Kind = LibSVM
	case "libfm":
		spec.Kind = LibFM
	case "movielens":
		spec.Kind = MovieLens
	default:
		return DataSpec{}, fmt.Errorf("%w: unknown data kind %q (want synthetic, criteo, libsvm, libfm or movielens)", ErrDataSpec, kind)
	}
	paths, err := SplitList(rest)
	if err != nil {
		return DataSpec{}, fmt.Errorf("%w: %s: %w", ErrDataSpec, kind, err)
	}
	if spec.Kind == MovieLens && len(paths) != 1 {
		return DataSpec{}, fmt.Errorf("%w: movielens takes one directory or ratings file, got %d paths", ErrDataSpec, len(paths))
	}
	spec.Paths = paths
	return spec, nil
}

// SplitList splits a comma-separated list of paths or addresses, refusing empty entries.
func SplitList(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty list")
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
		if parts[i] == "" {
			return nil, fmt.Errorf("empty entry %d in %q", i+1, s)
		}
	}
	return parts, nil
}

// String returns the specification in the form ParseDataSpec reads.
func (d DataSpec) String() string {
	if d.Kind == Synthetic {
		return "synthetic"
	}
	return d.Kind.String() + ":" + strings.Join(d.Paths, ",")
}
