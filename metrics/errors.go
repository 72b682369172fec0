package metrics

import "errors"

var (
	// ErrInvalidConfig is returned (wrapped, with every problem) by a constructor or
	// RegisterProcess given a bad Config.
	ErrInvalidConfig = errors.New("metrics: invalid config")
	// ErrNilSource is returned by NewServer given no source.
	ErrNilSource = errors.New("metrics: nil source")
)
