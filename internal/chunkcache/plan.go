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

// Ramp re-cuts a plan, front first, into heads that grow by one block
// each (the first GET 1 block, the next 2, .., the workers-th workers
// blocks) and then runs of capBlocks, in the plan's order: the GETs that
// start together then end one after the other, a block apart at least,
// and every later GET is a full run, so the workers keep the stagger the
// heads gave them. A head or run spans only blocks that follow each other
// both in the plan and in the object (one ranged GET); a gap ends it
// early. The heads may be longer than capBlocks: they exist only once.
//
// Why: equal GETs started at once share the link equally and end
// together, so every worker then waits out the store's latency at the
// same moment and the link idles. The heads' ends are as staggered as
// whole blocks allow, and the runs after them are equal so the stagger
// lasts: heads cut from the first runs with the rests of those runs
// queued after them (the ramp before this one) gave each worker the same
// bytes over its first two GETs, and they ended together again; and with
// 1 MiB blocks and 2 MiB runs, heads of i/workers of a run are 1 or 2
// blocks, barely staggered at all.
func Ramp(runs []Run, workers int, capBlocks int64) []Run {
	if workers <= 1 || len(runs) == 0 {
		return runs
	}
	capBlocks = max(1, capBlocks)
	var out []Run
	var cur Run
	want := func() int64 {
		if len(out) < workers {
			return int64(len(out) + 1)
		}
		return capBlocks
	}
	for _, r := range runs {
		if cur.Count > 0 && cur.First+cur.Count != r.First {
			out, cur = append(out, cur), Run{}
		}
		for r.Count > 0 {
			if cur.Count == 0 {
				cur.First = r.First
			}
			take := min(r.Count, want()-cur.Count)
			cur.Count += take
			r.First += take
			r.Count -= take
			if cur.Count == want() {
				out, cur = append(out, cur), Run{}
			}
		}
	}
	if cur.Count > 0 {
		out = append(out, cur)
	}
	return out
}
