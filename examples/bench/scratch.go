package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// shmRoot is where the suites keep their shared-memory scratch directories.
const shmRoot = "/dev/shm"

// ownerFile, inside a scratch directory, is kept locked by the process that made the directory
// for as long as it uses it.
const ownerFile = ".owner"

// shmScratch makes a scratch directory under root (shmRoot; a directory under fallback, on disk
// and slower, when root cannot be written) whose name starts with prefix, and returns it with the
// function that removes it. Memory under /dev/shm stays taken until its files are removed, and a
// run the system killed for want of memory runs no deferred call: so the directory holds a lock
// file this process keeps locked until release, and shmScratch first removes the directories
// under root with that prefix whose lock is free, those of runs that died.
func shmScratch(root, prefix, fallback string) (dir string, release func(), err error) {
	for _, d := range sweepScratch(root, prefix) {
		fmt.Printf("removed %s, left by a run that died\n", d)
	}
	// Made under a name the sweep does not match, and renamed once locked: a sweep never sees
	// the directory of a live run unlocked.
	tmp, err := os.MkdirTemp(root, "."+prefix)
	if err != nil {
		dir, err := os.MkdirTemp(fallback, prefix)
		return dir, func() { os.RemoveAll(dir) }, err
	}
	f, err := os.OpenFile(filepath.Join(tmp, ownerFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	dir = filepath.Join(root, strings.TrimPrefix(filepath.Base(tmp), "."))
	if err == nil {
		err = os.Rename(tmp, dir)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		os.RemoveAll(tmp)
		return "", nil, err
	}
	return dir, func() {
		os.RemoveAll(dir)
		f.Close()
	}, nil
}

// sweepScratch removes the scratch directories under root named prefix... whose owner's lock is
// free: their run ended without removing them. A directory with no lock file is left alone.
func sweepScratch(root, prefix string) []string {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		dir := filepath.Join(root, e.Name())
		f, err := os.Open(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil && os.RemoveAll(dir) == nil {
			removed = append(removed, dir)
		}
		f.Close()
	}
	return removed
}
