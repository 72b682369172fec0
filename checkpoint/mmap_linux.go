//go:build linux

package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// createExtent creates the file path of size bytes, reserves its blocks (so a full tmpfs fails here
// with ENOSPC instead of a SIGBUS on first touch later) and maps it read-write with every page faulted
// in. The mapping outlives the file descriptor.
func createExtent(path string, size int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fail := func(err error) ([]byte, error) {
		os.Remove(path)
		return nil, err
	}
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if !errors.Is(err, syscall.EOPNOTSUPP) {
			return fail(fmt.Errorf("reserve %d bytes for %s: %w", size, path, err))
		}
		if err := f.Truncate(size); err != nil {
			return fail(err)
		}
	}
	b, err := mapFD(int(f.Fd()), size, true)
	if err != nil {
		return fail(err)
	}
	return b, nil
}

// openExtent maps an existing extent file, read-write for the owner or read-only for a reader.
func openExtent(path string, writable bool) ([]byte, error) {
	flag := os.O_RDONLY
	if writable {
		flag = os.O_RDWR
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() <= 0 || st.Size() > 1<<46 {
		return nil, fmt.Errorf("extent %s has size %d", path, st.Size())
	}
	return mapFD(int(f.Fd()), st.Size(), writable)
}

func mapFD(fd int, size int64, writable bool) ([]byte, error) {
	prot := syscall.PROT_READ
	if writable {
		prot |= syscall.PROT_WRITE
	}
	b, err := syscall.Mmap(fd, 0, int(size), prot, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	return b, nil
}

func unmap(b []byte) error {
	if b == nil {
		return nil
	}
	return syscall.Munmap(b)
}

// lockRegion takes the region's lock file: exclusive for the owner, shared for a reader. It never
// waits: a region locked by a live owner reports ErrRegionLocked.
func lockRegion(path string, exclusive bool) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrRegionLocked, path)
		}
		return nil, err
	}
	return f, nil
}
