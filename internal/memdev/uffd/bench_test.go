package uffd

import (
	"context"
	"testing"

	"warmstart/internal/userfaultfd"
)

const benchMemoryBytes = 64 << 20

// BenchmarkFaults measures on-demand serving: a VMM child reads every page
// of a 64 MiB region once, each read a fault served from the lower file
// (in the page cache).
func BenchmarkFaults(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		f := newHandlerFor(b, Options{}, benchMemoryBytes, []testRegion{{Offset: 0, Size: benchMemoryBytes}})
		f.v, f.s = f.connect(f.regions)
		steps := reads(f.pages()...)
		b.StartTimer()
		f.v.touch(steps...)
		b.StopTimer()
		if n := f.s.Stats().Faults; n != uint64(len(steps)) {
			b.Fatalf("%d faults, want %d", n, len(steps))
		}
		f.s.Close()
		f.h.Close()
		b.StartTimer()
	}
	b.SetBytes(benchMemoryBytes)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchMemoryBytes/userfaultfd.PageSizeBytes), "ns/fault")
}

// BenchmarkInstall measures the prefetch path: Install of a whole 64 MiB
// region before the guest touches it.
func BenchmarkInstall(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		f := newHandlerFor(b, Options{}, benchMemoryBytes, []testRegion{{Offset: 0, Size: benchMemoryBytes}})
		f.v, f.s = f.connect(f.regions)
		b.StartTimer()
		if err := f.s.Install(context.Background(), 0, benchMemoryBytes); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if n := f.s.Stats().InstalledBytes; n != benchMemoryBytes {
			b.Fatalf("installed %d bytes", n)
		}
		f.s.Close()
		f.h.Close()
		b.StartTimer()
	}
	b.SetBytes(benchMemoryBytes)
}
