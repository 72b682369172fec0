//go:build linux || darwin || freebsd || netbsd || openbsd

package train

import "syscall"

// freeBytes returns the space available to this user in the file system holding dir.
func freeBytes(dir string) (uint64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return uint64(st.Bavail) * uint64(st.Bsize), true
}
