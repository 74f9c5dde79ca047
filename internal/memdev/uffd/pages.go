package uffd

import (
	"sync/atomic"
	"unsafe"
)

// pageBits is a fixed-size set of page indexes, safe for concurrent use.
type pageBits []atomic.Uint64

func newPageBits(n int) pageBits { return make(pageBits, (n+63)/64) }

func (b pageBits) test(i int) bool { return b[i/64].Load()&(1<<(i%64)) != 0 }

func (b pageBits) set(i int) { b[i/64].Or(1 << (i % 64)) }

func (b pageBits) clear(i int) { b[i/64].And(^uint64(1 << (i % 64))) }

// testAndClear clears bit i and reports whether it was set.
func (b pageBits) testAndClear(i int) bool {
	bit := uint64(1) << (i % 64)
	return b[i/64].And(^bit)&bit != 0
}

// bufAddr is the address of b's first byte, for the kernel to copy from.
func bufAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
