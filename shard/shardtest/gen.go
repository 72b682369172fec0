package shardtest

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// CriteoLines returns n synthetic lines of the Criteo TSV format (label, 13 integers, 26 hex
// categoricals, some columns empty), each followed by a newline, drawn from seed.
func CriteoLines(n int, seed uint64) string {
	r := rand.New(rand.NewPCG(seed, 0xc417e0))
	var b strings.Builder
	for range n {
		fmt.Fprintf(&b, "%d", r.IntN(2))
		for range 13 {
			b.WriteByte('\t')
			if r.IntN(8) != 0 {
				fmt.Fprintf(&b, "%d", r.IntN(1000)-5)
			}
		}
		for range 26 {
			b.WriteByte('\t')
			if r.IntN(10) != 0 {
				fmt.Fprintf(&b, "%08x", r.Uint32N(1<<20))
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// LibSVMLines returns n synthetic libSVM lines ("label idx:val ...") drawn from seed.
func LibSVMLines(n int, seed uint64) string {
	r := rand.New(rand.NewPCG(seed, 0x11b5f3))
	var b strings.Builder
	for range n {
		if r.IntN(2) == 0 {
			b.WriteString("-1")
		} else {
			b.WriteString("+1")
		}
		for k := r.IntN(6); k > 0; k-- {
			fmt.Fprintf(&b, " %d:%g", r.IntN(100000), float32(r.IntN(100))/10)
		}
		b.WriteByte('\n')
	}
	return b.String()
}
