package fusedev

import (
	"slices"
	"testing"
)

// TestPageSetRunsFromTheFirstPage: runs reports every marked run, the one
// starting at page 0 included (a generation's served pages told to a
// joining observer as resident, a view's written pages at a freeze).
func TestPageSetRunsFromTheFirstPage(t *testing.T) {
	const size = 64 * fillPageBytes
	s := newPageSet(size)
	s.mark(0, 2*fillPageBytes)
	s.mark(5*fillPageBytes, fillPageBytes)
	s.mark(63*fillPageBytes, fillPageBytes)
	var got [][2]int64
	s.runs(size, func(off, n int64) { got = append(got, [2]int64{off / fillPageBytes, n / fillPageBytes}) })
	if want := [][2]int64{{0, 2}, {5, 1}, {63, 1}}; !slices.Equal(got, want) {
		t.Fatalf("runs (first page, count) = %v, want %v", got, want)
	}
}
