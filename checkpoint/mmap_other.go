//go:build !linux

package checkpoint

import (
	"errors"
	"os"
)

// The shared-memory tier needs Linux (fallocate, populated shared mappings, flock on tmpfs).

var errNoShm = errors.New("checkpoint: shared-memory regions need Linux")

func createExtent(path string, size int64) ([]byte, error)     { return nil, errNoShm }
func openExtent(path string, writable bool) ([]byte, error)    { return nil, errNoShm }
func unmap(b []byte) error                                     { return nil }
func lockRegion(path string, exclusive bool) (*os.File, error) { return nil, errNoShm }
