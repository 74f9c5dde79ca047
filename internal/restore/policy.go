package restore

import (
	"fmt"
	"sort"
	"strings"

	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/prefetch"
)

// Policy is how a restore prefetches its startup manifest. The seed's is the
// default; the others reproduce peers' designs so that the benchmark can
// compare them on identical work.
type Policy struct {
	Name string `json:"name"`
	// Readers is the number of readers one task runs.
	Readers int `json:"readers"`
	// BufferBytes is each reader's buffer, and so the largest single read.
	BufferBytes int `json:"buffer_bytes"`
	// MaxReaders is the per-process limit on reads in progress that the
	// policy was designed for; the engine enforces the process's own
	// (prefetch.DefaultMaxReaders says how the two relate).
	MaxReaders int `json:"max_readers"`
	// Sorted reads the working set in file order instead of first-touch order.
	Sorted bool `json:"sorted"`
	// BeforeStart finishes the prefetch before the guest runs: the VM is
	// restored paused and resumed once every range is in.
	BeforeStart bool `json:"before_start"`
	// Fill, on a device with a page cache of its own (the file device),
	// has the device read the lower file and store the bytes straight
	// into that cache, instead of a buffered read through the device file
	// (memdev.TargetOptions.Fill).
	Fill bool `json:"fill"`
	// Hint advises the kernel of the whole plan up front
	// (POSIX_FADV_WILLNEED on the lower file), so storage reads every range
	// concurrently while the readers bring them in in first-touch order.
	Hint bool `json:"hint"`
	// Follow moves the task's cursor to where the guest faults, ahead of
	// prefetch, and reads what the guest has passed only after the rest
	// (prefetch.TaskOptions.Follow). It takes effect only while the guest
	// runs alongside the prefetch, so never with BeforeStart.
	Follow bool `json:"follow"`
	// GapBytes, above 0, has each range of a plan on local memory also
	// take the gap to the next recorded range in memory when that gap is
	// at most this long (see Policy.Plan).
	GapBytes int64 `json:"gap_bytes,omitempty"`
}

// The policies' names ([prefetch] policy, --policy, the API's "policy").
const (
	PolicyWarmstart = "warmstart"
	PolicySeed      = "seed"
	PolicyREAP      = "reap"
	PolicyE2B       = "e2b"
)

// Policies known by name.
var policies = map[string]Policy{
	// The seed: one reader per task, a 1 MiB buffer, at most four readers per
	// process, through the device, in first-touch order, concurrently with
	// the restore.
	PolicySeed: {Name: PolicySeed, Readers: 1, BufferBytes: 1 << 20, MaxReaders: prefetch.DefaultMaxReaders},
	// REAP (vHive): the whole recorded working set in one sequential pass,
	// installed before the VM runs.
	PolicyREAP: {Name: PolicyREAP, Readers: 1, BufferBytes: 4 << 20, MaxReaders: 1, Sorted: true, BeforeStart: true},
	// E2B: first-touch order, page by page, several workers, concurrently.
	PolicyE2B: {Name: PolicyE2B, Readers: 8, BufferBytes: 4096, MaxReaders: 8},
	// warmstart (measured on the reference snapshot, see README): the
	// device fills its own page cache (one lower-file read and one store
	// per run, where a buffered read through the device file costs a FUSE
	// round trip per readahead window), the whole plan is hinted to storage
	// up front, and two readers (one per core here) fill in first-touch
	// order concurrently with the restore, following the guest: a fault
	// ahead of them moves them to it.
	PolicyWarmstart: {Name: PolicyWarmstart, Readers: 2, BufferBytes: 1 << 20, MaxReaders: prefetch.DefaultMaxReaders, Fill: true, Hint: true, Follow: true, GapBytes: 16 << 10},
}

// DefaultPolicy is the policy a restore uses unless told otherwise.
const DefaultPolicy = PolicyWarmstart

// PolicyNames lists the known policies in a stable order.
func PolicyNames() []string {
	names := make([]string, 0, len(policies))
	for n := range policies {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupPolicy returns the named policy.
func LookupPolicy(name string) (Policy, error) {
	p, ok := policies[name]
	if !ok {
		return Policy{}, fmt.Errorf("unknown prefetch policy %q (known: %s)", name, strings.Join(PolicyNames(), ", "))
	}
	return p, nil
}

// Plan turns a manifest's ranges into the policy's read plan. With
// gaps (local memory), a range followed in memory, within GapBytes, by
// another recorded range also takes the pages between them: a guest whose
// start-up drifts touches pages next to the ones it touched before far
// more often than pages elsewhere, each such page is a fault's round trip
// where prefetch missed it, and bringing it along costs a few KiB of a
// read prefetch makes anyway. The pages taken along are not part of the
// manifest: its accounting and learning see only the recorded pages.
func (p Policy) Plan(m *manifest.Manifest, gaps bool) []prefetch.Range {
	rs := make([]prefetch.Range, len(m.Ranges))
	for i, r := range m.Ranges {
		rs[i] = prefetch.Range{Offset: r.Offset, Length: r.Length}
	}
	if gaps && p.GapBytes > 0 {
		absorbGaps(rs, p.GapBytes, m.Layout)
		rs = mergeNearRanks(rs, mergeRanks, int64(p.BufferBytes))
	}
	if p.Sorted {
		// The engine merges ranges that are exactly contiguous, so sorting
		// is all a sequential pass needs.
		sort.Slice(rs, func(i, j int) bool { return rs[i].Offset < rs[j].Offset })
	}
	return rs
}

// TaskOptions is the engine's view of the policy.
func (p Policy) TaskOptions() prefetch.TaskOptions {
	return prefetch.TaskOptions{Readers: p.Readers, BufferBytes: p.BufferBytes, Follow: p.Follow && !p.BeforeStart}
}

// mergeRanks is how far ahead in the plan mergeNearRanks looks for a
// range that continues one in memory.
const mergeRanks = 32

// mergeNearRanks makes fewer, larger reads of a plan whose ranges touch
// in memory (after absorbGaps) but not in plan order: a range that begins
// where an earlier one ends, at most window ranks after it, is read with
// it, up to maxBytes per read. Each read costs a system call or two and a
// trip through the prefetch engine whatever its size; a range brought
// forward by a few ranks is one the guest touches a moment later. Every
// byte stays in the plan exactly once; the first range keeps its rank.
func mergeNearRanks(rs []prefetch.Range, window int, maxBytes int64) []prefetch.Range {
	if maxBytes <= 0 {
		return rs
	}
	starts := make(map[int64]int, len(rs)) // offset -> rank of the range starting there
	for i, r := range rs {
		starts[r.Offset] = i
	}
	merged := make([]bool, len(rs))
	out := rs[:0:0]
	for i := range rs {
		if merged[i] {
			continue
		}
		r := rs[i]
		for {
			j, ok := starts[r.Offset+r.Length]
			if !ok || j <= i || j > i+window || merged[j] || r.Length+rs[j].Length > maxBytes {
				break
			}
			merged[j] = true
			r.Length += rs[j].Length
		}
		out = append(out, r)
	}
	return out
}

// absorbGaps extends each range over the gap to the next range in memory
// order, where that gap is at most gapBytes and lies inside the region
// holding both: a hole between regions is no guest memory (a device that
// installs into the VM's memory refuses it). Order is kept.
func absorbGaps(rs []prefetch.Range, gapBytes int64, l layout.Layout) {
	byOffset := make([]int, len(rs))
	for i := range byOffset {
		byOffset[i] = i
	}
	sort.SliceStable(byOffset, func(a, b int) bool { return rs[byOffset[a]].Offset < rs[byOffset[b]].Offset })
	for k := 0; k+1 < len(byOffset); k++ {
		r, next := &rs[byOffset[k]], rs[byOffset[k+1]]
		end := r.Offset + r.Length
		if gap := next.Offset - end; gap > 0 && gap <= gapBytes && l.Contains(end-1, gap+2) {
			r.Length += gap
		}
	}
}
