// Package synth generates the reference snapshot: a synthetic guest memory
// file, a vm state placeholder, its memory layout and a startup trace shaped
// like a Linux guest resuming from a snapshot until its agent answers. It is
// the fixed input of every benchmark and of the tests that need realistic
// memory, and it is fully determined by (memory size, seed).
//
// # Model
//
// Sizes below are for the 128 MiB reference guest; every region scales with
// the memory size (the layout of a smaller or larger guest is the same
// picture, stretched). Memory is one region covering the whole file, as
// Firecracker writes for guests under 3 GiB.
//
//	region            where           size     non-zero  touched  writes  run
//	boot data         0 MiB           1 MiB    20 %      5 %      20 %    single pages
//	kernel text       16 MiB          12 MiB   99 %      50 %     0 %     runs of ~8
//	kernel rodata     28 MiB          4 MiB    95 %      35 %     0 %     runs of ~3
//	kernel data       32 MiB          2 MiB    75 %      60 %     35 %    runs of ~4
//	kernel bss        34 MiB          3 MiB    30 %      45 %     50 %    runs of ~4
//	memmap, page      122 MiB (top)   6 MiB    90 %      50 %     30 %    runs of ~6
//	  tables, percpu
//	page cache        chunks of 64-512 KiB    28 MiB   97 %  45 %   1 %  runs of ~8
//	agent heap        3 clusters (50/30/20 %) 14 MiB   75 %  60 %  30 %  runs of ~12
//	stacks            8 clusters              2 MiB    40 %  50 %  60 %  top of each stack
//	slab              scattered single pages  10 MiB   95 %  45 %  20 %  single pages
//	free memory       everything else         ~46 MiB  0 %   0 %
//
// Page cache, heap, stack and slab pages are placed at random in the memory
// the fixed regions leave free, as the buddy allocator hands pages out. The result is about 40 MiB touched (31 %
// of memory), about 45 % of the file zero pages (free memory is zero in a
// guest that has not yet reused it), some zero pages inside the touched set
// (bss, fresh heap and stack pages), and about 15 % of touches writes.
// Non-zero pages hold pseudo-random bytes, so the file does not compress.
//
// The touch order follows a resuming kernel: each region is a stream whose
// touched pages come in runs, visited mostly in ascending address order
// (neighbouring runs are swapped now and then, as call order is not address
// order). Streams become eligible at points of the timeline: the kernel's
// own memory from the start, slab soon after, then page cache, stacks and
// the heap clusters as the agent is scheduled. The next burst is drawn from
// the eligible streams weighted by the pages they have left, so streams
// interleave and finish together; a burst takes a run-length-like number of
// consecutive touches from one stream.
//
// Compute time before each touch stands for guest execution: about 1.5 µs
// (exponentially distributed) between touches of one burst, about 8 µs when
// execution jumps to another stream, and one pause of 1-3 ms per 5 MiB
// touched (device resume, timer work, the agent starting). The reference
// trace spends about 45 ms computing, so a restore's time to ready depends
// on memory latency without being only that.
package synth

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/trace"
)

// Memory sizes the generator accepts. Below the minimum the model's regions
// would shrink to nothing; above the maximum the in-memory page maps would
// be unreasonable for a synthetic workload.
const (
	MinMemoryBytes     = 8 << 20
	MaxMemoryBytes     = 64 << 30
	DefaultMemoryBytes = 128 << 20
)

// referenceMiB is the guest size the region table is written for.
const referenceMiB = 128

// Salts separate the random streams derived from one seed.
const (
	modelSalt   = 0x6d6f64656c // the placement and trace stream
	contentSalt = 0x636f6e74656e74
)

// pattern is how a region's touched pages are arranged.
type pattern int

const (
	patternRuns   pattern = iota // alternating touched runs and untouched gaps
	patternSingle                // independent single pages
	patternTop                   // one run at the top of each cluster (a stack)
)

// region is one row of the model table.
type region struct {
	name string
	// Size and fixed placement in MiB of the reference guest; fixedAt < 0
	// places the region's clusters at random in free memory.
	fixedAt, sizeMiB float64
	// clusters splits a randomly placed region: shares of its size, one
	// stream each when separate is set. chunkPages places it as chunks of
	// random size between the two bounds instead; singles places it page
	// by page.
	clusters             []float64
	separate             bool
	chunkMin, chunkMax   int
	singles              bool
	nonZero, touch, writ float64
	pat                  pattern
	runPages             float64 // mean touched run and burst length
	activation           float64 // timeline progress at which the stream starts
}

var regions = []region{
	{name: "boot data", fixedAt: 0, sizeMiB: 1, nonZero: 0.20, touch: 0.05, writ: 0.20, pat: patternSingle, runPages: 1},
	{name: "kernel text", fixedAt: 16, sizeMiB: 12, nonZero: 0.99, touch: 0.50, pat: patternRuns, runPages: 8},
	{name: "kernel rodata", fixedAt: 28, sizeMiB: 4, nonZero: 0.95, touch: 0.35, pat: patternRuns, runPages: 3, activation: 0.02},
	{name: "kernel data", fixedAt: 32, sizeMiB: 2, nonZero: 0.75, touch: 0.60, writ: 0.35, pat: patternRuns, runPages: 4},
	{name: "kernel bss", fixedAt: 34, sizeMiB: 3, nonZero: 0.30, touch: 0.45, writ: 0.50, pat: patternRuns, runPages: 4},
	{name: "memmap and page tables", fixedAt: referenceMiB - 6, sizeMiB: 6, nonZero: 0.90, touch: 0.50, writ: 0.30, pat: patternRuns, runPages: 6},
	{name: "stacks", fixedAt: -1, sizeMiB: 2, clusters: []float64{1, 1, 1, 1, 1, 1, 1, 1}, nonZero: 0.40, touch: 0.50, writ: 0.60, pat: patternTop, runPages: 4, activation: 0.30},
	{name: "agent heap", fixedAt: -1, sizeMiB: 14, clusters: []float64{0.5, 0.3, 0.2}, separate: true, nonZero: 0.75, touch: 0.60, writ: 0.30, pat: patternRuns, runPages: 12, activation: 0.35},
	{name: "page cache", fixedAt: -1, sizeMiB: 28, chunkMin: 16, chunkMax: 128, nonZero: 0.97, touch: 0.45, writ: 0.01, pat: patternRuns, runPages: 8, activation: 0.25},
	{name: "slab", fixedAt: -1, sizeMiB: 10, singles: true, nonZero: 0.95, touch: 0.45, writ: 0.20, pat: patternSingle, runPages: 1, activation: 0.05},
}

// Compute-time model, per touch.
const (
	burstComputeMean  = 1500 * time.Nanosecond
	switchComputeMean = 8 * time.Microsecond
	pauseMin          = time.Millisecond
	pauseMax          = 3 * time.Millisecond
	// touchedBytesPerPause spaces the long pauses: one per this many bytes
	// of touched memory, at least one.
	touchedBytesPerPause = 5 << 20
)

// Model is a reference snapshot held in memory: its layout, its startup
// trace and which of its pages are zero. Page content is derived on demand.
type Model struct {
	Layout layout.Layout
	Trace  []trace.Entry
	seed   uint64
	zero   []bool // per page
	// region is, per page, the index in regions of the region it belongs
	// to, or freeRegion: what a drifting variant draws its pages from.
	region []int8
}

// freeRegion marks a page no region of the model holds.
const freeRegion = -1

// Stats summarises a model.
type Stats struct {
	MemoryBytes  int64
	ZeroPages    int
	TouchedPages int
	// TouchedZeroPages counts touched pages whose content is zero.
	TouchedZeroPages int
	Writes           int
	Compute          time.Duration
}

// Stats computes the model's summary.
func (m *Model) Stats() Stats {
	ts := trace.Summarize(m.Trace)
	s := Stats{MemoryBytes: m.Layout.FileSize, TouchedPages: ts.Pages, Writes: ts.Writes, Compute: ts.Compute}
	for _, z := range m.zero {
		if z {
			s.ZeroPages++
		}
	}
	for _, e := range m.Trace {
		if m.zero[e.Offset/trace.PageBytes] {
			s.TouchedZeroPages++
		}
	}
	return s
}

// Pages is the number of pages in the memory file.
func (m *Model) Pages() int { return len(m.zero) }

// PageIsZero reports whether page i of the memory file is all zero bytes.
func (m *Model) PageIsZero(i int) bool { return m.zero[i] }

// FillPage writes the content of page i into buf, which must hold
// trace.PageBytes bytes.
func (m *Model) FillPage(i int, buf []byte) {
	buf = buf[:trace.PageBytes]
	if m.zero[i] {
		clear(buf)
		return
	}
	var src rand.PCG
	src.Seed(m.seed^contentSalt, splitmix(uint64(i)))
	for j := 0; j < len(buf); j += 8 {
		binary.LittleEndian.PutUint64(buf[j:], src.Uint64())
	}
	buf[0] |= 1 // a non-zero page must never read as zero
}

// splitmix scrambles a counter so neighbouring pages seed unrelated streams.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// stream is the touched pages of one region or cluster, in touch order.
type stream struct {
	reg   *region
	pages []int
	next  int
}

// CheckMemorySize refuses a memory size the model cannot lay out.
func CheckMemorySize(memoryBytes int64) error {
	if memoryBytes < MinMemoryBytes || memoryBytes > MaxMemoryBytes || memoryBytes%trace.PageBytes != 0 {
		return fmt.Errorf("synthetic memory size %d: want a multiple of %d between %d and %d bytes",
			memoryBytes, trace.PageBytes, int64(MinMemoryBytes), int64(MaxMemoryBytes))
	}
	return nil
}

// NewModel builds the reference snapshot model for a guest of memoryBytes
// (a multiple of trace.PageBytes within [MinMemoryBytes, MaxMemoryBytes]).
func NewModel(memoryBytes int64, seed uint64) (*Model, error) {
	if err := CheckMemorySize(memoryBytes); err != nil {
		return nil, err
	}
	n := int(memoryBytes / trace.PageBytes)
	m := &Model{Layout: layout.Single(memoryBytes), seed: seed, zero: make([]bool, n), region: make([]int8, n)}
	for i := range m.zero {
		m.zero[i] = true // free memory; regions below overwrite their pages
		m.region[i] = freeRegion
	}
	r := rand.New(rand.NewPCG(seed, modelSalt))
	used := make([]bool, n)
	pagesOf := func(mib float64) int { return max(1, int(math.Round(mib/referenceMiB*float64(n)))) }

	var streams []*stream
	for i := range regions {
		reg := &regions[i]
		clusters, err := placeRegion(r, used, reg, pagesOf)
		if err != nil {
			return nil, fmt.Errorf("place %s: %w", reg.name, err)
		}
		for _, c := range clusters {
			for p := c[0]; p < c[0]+c[1]; p++ {
				used[p] = true
				m.zero[p] = r.Float64() >= reg.nonZero
				m.region[p] = int8(i)
			}
		}
		streams = append(streams, touchedStreams(r, reg, clusters)...)
	}
	m.Trace = interleave(r, streams)
	return m, nil
}

// placeRegion places a region's clusters ([start, length) in pages): at
// its fixed place, or at random in the pages used leaves free, page by
// page, chunk by chunk or cluster by cluster.
func placeRegion(r *rand.Rand, used []bool, reg *region, pagesOf func(mib float64) int) ([][2]int, error) {
	n := len(used)
	var clusters [][2]int
	add := func(length, align int) error {
		p, err := place(r, used, length, align)
		clusters = append(clusters, [2]int{p, length})
		return err
	}
	switch {
	case reg.fixedAt >= 0:
		start := int(math.Round(reg.fixedAt / referenceMiB * float64(n)))
		clusters = append(clusters, [2]int{start, min(pagesOf(reg.sizeMiB), n-start)})
	case reg.singles:
		for range pagesOf(reg.sizeMiB) {
			if err := add(1, 1); err != nil {
				return nil, err
			}
		}
	case reg.chunkMax > 0:
		for left := pagesOf(reg.sizeMiB); left > 0; {
			length := min(left, scaledChunk(r, reg, n))
			if err := add(length, 1); err != nil {
				return nil, err
			}
			left -= length
		}
	default:
		total, shares := pagesOf(reg.sizeMiB), 0.0
		for _, share := range reg.clusters {
			shares += share
		}
		for _, share := range reg.clusters {
			if err := add(max(1, int(math.Round(share/shares*float64(total)))), 16); err != nil {
				return nil, err
			}
		}
	}
	return clusters, nil
}

// scaledChunk draws a chunk length between the region's bounds, scaled so a
// small guest still gets several chunks.
func scaledChunk(r *rand.Rand, reg *region, n int) int {
	scale := math.Min(1, float64(n)/(referenceMiB<<20/trace.PageBytes))
	lo := max(1, int(float64(reg.chunkMin)*scale))
	hi := max(lo, int(float64(reg.chunkMax)*scale))
	return lo + r.IntN(hi-lo+1)
}

// place finds length free pages in used, starting at a multiple of align,
// at a random position, and marks them used. It falls back to a scan from a
// random start so a crowded map still places when any gap fits.
func place(r *rand.Rand, used []bool, length, align int) (int, error) {
	n := len(used)
	if length > n {
		return 0, fmt.Errorf("%d pages do not fit in %d", length, n)
	}
	fits := func(p int) bool {
		for q := p; q < p+length; q++ {
			if used[q] {
				return false
			}
		}
		return true
	}
	take := func(p int) int {
		for q := p; q < p+length; q++ {
			used[q] = true
		}
		return p
	}
	slots := (n - length) / align
	for range 64 {
		p := r.IntN(slots+1) * align
		if fits(p) {
			return take(p), nil
		}
	}
	start := r.IntN(slots + 1)
	for k := range slots + 1 {
		p := ((start + k) % (slots + 1)) * align
		if fits(p) {
			return take(p), nil
		}
	}
	return 0, fmt.Errorf("no free run of %d pages", length)
}

// geometric draws a length >= 1 with the given mean.
func geometric(r *rand.Rand, mean float64) int {
	if mean <= 1 {
		return 1
	}
	return 1 + int(r.ExpFloat64()*(mean-1))
}

// touchedStreams picks the touched pages of a region's clusters and orders
// them as the region's stream, or one stream per cluster for a region whose
// clusters are used independently (the heap arenas).
func touchedStreams(r *rand.Rand, reg *region, clusters [][2]int) []*stream {
	perCluster := make([][][]int, len(clusters))
	for i, c := range clusters {
		perCluster[i] = touchedRuns(r, reg, c[0], c[1])
	}
	switch {
	case reg.separate:
		out := make([]*stream, len(clusters))
		for i, runs := range perCluster {
			out[i] = &stream{reg: reg, pages: flatten(ascending(r, runs))}
		}
		return out
	case reg.pat == patternSingle:
		// Slab objects and boot data are found through pointers: no order.
		pages := flatten(slices.Concat(perCluster...))
		r.Shuffle(len(pages), func(i, j int) { pages[i], pages[j] = pages[j], pages[i] })
		return []*stream{{reg: reg, pages: pages}}
	case reg.chunkMax > 0:
		// Page cache: each file is read front to back, files in any order.
		r.Shuffle(len(perCluster), func(i, j int) { perCluster[i], perCluster[j] = perCluster[j], perCluster[i] })
		var pages []int
		for _, runs := range perCluster {
			pages = append(pages, flatten(ascending(r, runs))...)
		}
		return []*stream{{reg: reg, pages: pages}}
	default:
		return []*stream{{reg: reg, pages: flatten(ascending(r, slices.Concat(perCluster...)))}}
	}
}

// ascending orders runs by address, then swaps neighbouring runs now and
// then: code runs mostly forward, but call order is not address order.
func ascending(r *rand.Rand, runs [][]int) [][]int {
	slices.SortFunc(runs, func(a, b []int) int { return cmp.Compare(a[0], b[0]) })
	for i := 0; i+1 < len(runs); i++ {
		if r.Float64() < 0.25 {
			runs[i], runs[i+1] = runs[i+1], runs[i]
			i++
		}
	}
	return runs
}

func flatten(runs [][]int) []int {
	var pages []int
	for _, run := range runs {
		pages = append(pages, run...)
	}
	return pages
}

// touchedRuns selects a cluster's touched pages as runs of consecutive pages.
func touchedRuns(r *rand.Rand, reg *region, start, length int) [][]int {
	var runs [][]int
	switch reg.pat {
	case patternSingle:
		for p := start; p < start+length; p++ {
			if r.Float64() < reg.touch {
				runs = append(runs, []int{p})
			}
		}
	case patternTop:
		k := max(1, int(math.Round(reg.touch*float64(length))))
		var run []int
		for p := start + length - k; p < start+length; p++ {
			run = append(run, p)
		}
		runs = append(runs, run)
	default:
		gapMean := reg.runPages * (1 - reg.touch) / reg.touch
		touching := r.Float64() < reg.touch
		for p := start; p < start+length; {
			var k int
			if touching {
				k = geometric(r, reg.runPages)
			} else {
				k = geometric(r, gapMean)
			}
			k = min(k, start+length-p)
			if touching {
				run := make([]int, k)
				for j := range run {
					run[j] = p + j
				}
				runs = append(runs, run)
			}
			p += k
			touching = !touching
		}
	}
	return runs
}

// interleave merges the streams into one trace with compute times.
func interleave(r *rand.Rand, streams []*stream) []trace.Entry {
	total := 0
	for _, s := range streams {
		total += len(s.pages)
	}
	entries := make([]trace.Entry, 0, total)
	for len(entries) < total {
		progress := float64(len(entries)) / float64(total)
		s := pick(r, streams, progress)
		burst := geometric(r, s.reg.runPages)
		for k := 0; k < burst && s.next < len(s.pages); k++ {
			mean := burstComputeMean
			if k == 0 {
				mean = switchComputeMean
			}
			entries = append(entries, trace.Entry{
				Offset:  int64(s.pages[s.next]) * trace.PageBytes,
				Write:   r.Float64() < s.reg.writ,
				Compute: time.Duration(r.ExpFloat64() * float64(mean)),
			})
			s.next++
		}
	}
	pauses := max(1, total*trace.PageBytes/touchedBytesPerPause)
	for range pauses {
		if total == 0 {
			break
		}
		i := r.IntN(total)
		entries[i].Compute += pauseMin + time.Duration(r.Int64N(int64(pauseMax-pauseMin)))
	}
	return entries
}

// pick draws the stream of the next burst among those eligible at this
// point of the timeline, weighted by the pages they have left. When none is
// eligible yet, the earliest stream with pages left goes.
func pick(r *rand.Rand, streams []*stream, progress float64) *stream {
	var weight int
	var earliest *stream
	for _, s := range streams {
		left := len(s.pages) - s.next
		if left == 0 {
			continue
		}
		if s.reg.activation <= progress {
			weight += left
		}
		if earliest == nil || s.reg.activation < earliest.reg.activation {
			earliest = s
		}
	}
	if weight == 0 {
		return earliest
	}
	w := r.IntN(weight)
	for _, s := range streams {
		left := len(s.pages) - s.next
		if left == 0 || s.reg.activation > progress {
			continue
		}
		if w < left {
			return s
		}
		w -= left
	}
	return earliest
}
