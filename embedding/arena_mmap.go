//go:build !race && (linux || darwin || freebsd || netbsd || openbsd)

package embedding

import (
	"syscall"
	"unsafe"
)

const offHeap = true

func allocWords(n int) []uint32 {
	b, err := syscall.Mmap(-1, 0, n*4, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

func freeWords(w []uint32) {
	syscall.Munmap(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), 4*len(w)))
}

func unsafeWords(p *uint32, n int) []uint32 { return unsafe.Slice(p, n) }
