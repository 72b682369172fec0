//go:build unix

package kubetest_test

import "syscall"

// touchMiB maps mib MiB of anonymous memory and writes a byte in each page, so that all of it
// counts in the process's memory cgroup. The mapping lies outside the Go heap, where neither the
// garbage collector nor the race detector adds to it.
func touchMiB(mib int) error {
	b, err := syscall.Mmap(-1, 0, mib<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return err
	}
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	return nil // the mapping lives until the process exits
}
