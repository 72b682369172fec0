//go:build linux

package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
)

// createExtent creates the file path of size bytes, reserves its blocks (so a full tmpfs fails here
// with ENOSPC instead of a SIGBUS on first touch later) and maps it read-write with every page faulted
// in (in parallel, see populate). The mapping outlives the file descriptor.
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
	b, err := mapFD(int(f.Fd()), size, true, true)
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
	// Its pages exist: read faults map them many at a time (and writably in a writable shared
	// mapping of tmpfs), where write faults take one page each.
	return mapFD(int(f.Fd()), st.Size(), writable, false)
}

// mapFD maps size bytes of fd shared, with every page faulted in: by write faults with write (the
// pages of a new file are zeroed then), else by read faults.
func mapFD(fd int, size int64, writable, write bool) ([]byte, error) {
	prot := syscall.PROT_READ
	if writable {
		prot |= syscall.PROT_WRITE
	}
	b, err := syscall.Mmap(fd, 0, int(size), prot, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	populate(b, write)
	return b, nil
}

// madvise advice values of Linux 5.14.
const (
	madvPopulateRead  = 22
	madvPopulateWrite = 23
)

// populate faults in every page of the mapping b, on GOMAXPROCS goroutines at once, each asking
// the kernel to fault in its part (MADV_POPULATE_WRITE with write, else MADV_POPULATE_READ); with
// write, or when the kernel lacks the advice, each then loads one byte of every page of its part.
// For a new extent the advice is several times faster than MAP_POPULATE, which faults (and zeroes)
// one page at a time on one thread.
//
// The loads are needed after the write advice: under a hypervisor that shadows the guest's page
// tables, a page the kernel faulted in costs a trap to the host at its first access from user
// space (about 10 µs a page measured on a two-vCPU guest: 14 MiB took 20-30 ms to copy into at
// first and 1 ms afterwards, with no page fault in the guest). Paid when a new extent is created,
// that cost stays out of the snapshots, whose blocking copy would otherwise pay it for every page
// it writes for the first time. On bare metal the loads cost tens of microseconds per MiB. An
// extent mapped again after a restart (read advice) is not loaded: that would cost a restarted
// server the time before it can restore (both generations, when a restore reads one chain).
func populate(b []byte, write bool) {
	advice := madvPopulateRead
	if write {
		advice = madvPopulateWrite
	}
	page := os.Getpagesize()
	const minPart = 16 << 20
	parts := max(1, min(runtime.GOMAXPROCS(0), len(b)/minPart))
	per := (len(b)/parts + page - 1) / page * page
	var wg sync.WaitGroup
	for lo := 0; lo < len(b); lo += per {
		part := b[lo:min(lo+per, len(b))]
		wg.Go(func() {
			if err := syscall.Madvise(part, advice); err == nil && !write {
				return
			}
			touchPages(part, page)
		})
	}
	wg.Wait()
}

// touchPages loads one byte of every page of b.
func touchPages(b []byte, page int) {
	var sink byte
	for i := 0; i < len(b); i += page {
		sink += b[i]
	}
	touchSink.Add(uint32(sink))
}

// touchSink keeps the loads of touchPages.
var touchSink atomic.Uint32

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
