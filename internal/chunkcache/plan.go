package chunkcache

import "fmt"

// DefaultRunCapBytes caps the bytes of one prefetch run (one ranged GET).
// Long runs save requests; capping them keeps the first block of every run
// arriving early and lets several runs stream at once. Measured with 1 MiB
// blocks and 8 runs at once (see cache.go for the setup), cold prefetch-on
// time to ready: 2 MiB runs 584 ms (74 GETs), 4 MiB 569 ms (52), 8 MiB
// 348-531 ms (32), 16 MiB 352-373 ms (19), 32 MiB 499 ms (11). 8 and 16 MiB
// are level within the noise; 8 MiB keeps more, smaller runs in flight.
const DefaultRunCapBytes = 8 << 20

// Range is a run of an object's bytes, [Offset, Offset+Length): for memory,
// a logical range of a startup manifest.
type Range struct {
	Offset int64
	Length int64
}

// Run is a run of consecutive blocks fetched with one ranged GET.
type Run struct {
	First int64 // index of the first block
	Count int64 // number of blocks
}

// Plan is the physical-range planner: it maps ranges of an object of size
// bytes, given in first-touch order, to runs of blocks of blockBytes.
//
// Every block a range touches appears in exactly one run. Runs are ordered
// by the first touch of their first block. A run starts at the earliest
// touched block not yet planned and extends over the following blocks (in
// address order) that some range also touches, however late, until it
// reaches runCapBytes or a block no range touches. So a neighbour touched
// later rides along with an earlier request instead of paying a request of
// its own, and within a run bytes still arrive in address order from the
// block touched first. Parts of ranges beyond size are ignored.
func Plan(ranges []Range, size, blockBytes, runCapBytes int64) ([]Run, error) {
	if size <= 0 || blockBytes <= 0 {
		return nil, fmt.Errorf("plan: object size %d and block size %d must be positive", size, blockBytes)
	}
	blocks := (size + blockBytes - 1) / blockBytes
	touched, order, err := touchOrder(ranges, size, blockBytes, blocks)
	if err != nil {
		return nil, err
	}
	capBlocks := max(1, runCapBytes/blockBytes)
	planned := make([]bool, blocks)
	var runs []Run
	for _, b := range order {
		if planned[b] {
			continue
		}
		run := Run{First: b, Count: 1}
		planned[b] = true
		for run.Count < capBlocks {
			next := run.First + run.Count
			if next >= blocks || !touched[next] || planned[next] {
				break
			}
			planned[next] = true
			run.Count++
		}
		runs = append(runs, run)
	}
	return runs, nil
}

// touchOrder marks the blocks (of blocks) that ranges touch, and lists
// them in the order of their first touch.
func touchOrder(ranges []Range, size, blockBytes, blocks int64) (touched []bool, order []int64, err error) {
	touched = make([]bool, blocks)
	for i, r := range ranges {
		if r.Offset < 0 || r.Length < 0 || r.Offset > size || r.Length > size {
			return nil, nil, fmt.Errorf("plan: range %d [%d, +%d) is outside the %d-byte object", i, r.Offset, r.Length, size)
		}
		end := min(r.Offset+r.Length, size)
		if end <= r.Offset {
			continue
		}
		for b := r.Offset / blockBytes; b <= (end-1)/blockBytes; b++ {
			if !touched[b] {
				touched[b] = true
				order = append(order, b)
			}
		}
	}
	return touched, order, nil
}

// Ramp cuts each of the first workers runs of a plan to a head whose
// length grows from 1/workers of the run to all of it, and plans the
// rests right after those heads, in the same order: the GETs that start
// together then end one after the other, and each worker that ends early
// goes on with the rest of the run nearest the front.
//
// Why: equal runs started at once share the link equally and end
// together, so every worker then waits out the store's latency at the
// same moment and the link idles; and the front of the plan, which the
// guest wants first, arrives at the link's rate divided by the workers.
// Staggered ends keep some GET streaming while another waits for its
// first byte, and the front arrives first.
func Ramp(runs []Run, workers int) []Run {
	if workers <= 1 || len(runs) == 0 {
		return runs
	}
	n := min(workers, len(runs))
	heads := make([]Run, 0, n)
	var rests []Run
	for i, r := range runs[:n] {
		head := max(1, r.Count*int64(i+1)/int64(workers))
		heads = append(heads, Run{First: r.First, Count: head})
		if head < r.Count {
			rests = append(rests, Run{First: r.First + head, Count: r.Count - head})
		}
	}
	out := append(heads, rests...)
	return append(out, runs[n:]...)
}
