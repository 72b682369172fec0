//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package train

// freeBytes reports no /dev/shm on systems without statfs.
func freeBytes(dir string) (uint64, bool) { return 0, false }
