//go:build race || !(linux || darwin || freebsd || netbsd || openbsd)

package embedding

import "unsafe"

const offHeap = false

func allocWords(n int) []uint32 { return make([]uint32, n) }

func freeWords([]uint32) {}

func unsafeWords(p *uint32, n int) []uint32 { return unsafe.Slice(p, n) }
