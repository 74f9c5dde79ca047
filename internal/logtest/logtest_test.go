package logtest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
)

// Lines written from many goroutines at once all arrive whole, and Take
// hands each out once.
func TestBufferTakesWholeLinesOnce(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { fmt.Fprintf(&b, "line %02d\n", i) })
	}
	wg.Wait()
	lines := b.Take()
	slices.Sort(lines)
	if len(lines) != 50 || lines[0] != "line 00" || lines[49] != "line 49" {
		t.Fatalf("took %d lines %q..., want 50 whole lines", len(lines), lines[:min(3, len(lines))])
	}
	if again := b.Take(); again != nil {
		t.Fatalf("second take %q, want nothing", again)
	}
	fmt.Fprint(&b, "x\n")
	if b.String() != "x\n" {
		t.Fatalf("String %q after a take, want only what came after it", b.String())
	}
}
