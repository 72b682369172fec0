//go:build linux

package kubetest_test

import "syscall"

// tmpfsMagic is the type statfs gives a tmpfs.
const tmpfsMagic = 0x01021994

// filesystem returns the size in bytes and the type of the filesystem that holds dir.
func filesystem(dir string) (size, fsType int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Blocks) * st.Bsize, st.Type, nil
}
