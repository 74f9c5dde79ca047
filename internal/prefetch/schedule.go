package prefetch

import (
	"cmp"
	"math"
	"slices"
	"sort"
	"sync/atomic"
)

// schedule decides which read of a task's plan is claimed next. Reads are
// claimed in plan order from a cursor; a task that follows the guest moves
// the cursor forward to the read holding a page the guest faulted before
// prefetch reached it. The reads the cursor jumped over are work the guest
// has already passed: they are claimed after the end of the plan, in plan
// order, by a second pass over every read not yet claimed.
//
// Every read is claimed exactly once, by a compare-and-swap on its own
// flag: readers, a jump and the second pass may race for one read, and
// exactly one of them wins it. The cursor only moves forward, and the
// second pass starts only once the cursor is past the end, so a read the
// cursor skipped is never left behind. Memory is O(reads): the plan, its
// offset index and one flag per read.
type schedule struct {
	reads []read
	// byOffset holds the ranks (indices into reads) sorted by offset, for
	// finding the reads that hold a faulted page.
	byOffset []int
	// longest is the length of the longest read: a read overlapping
	// offset off starts after off-longest.
	longest int64
	follow  bool
	claimed []atomic.Bool

	cursor atomic.Int64 // rank of the next read of the first pass
	again  atomic.Int64 // rank the second pass looks at next
}

func newSchedule(reads []read, follow bool) *schedule {
	s := &schedule{reads: reads, follow: follow, claimed: make([]atomic.Bool, len(reads))}
	if !follow {
		return s
	}
	s.byOffset = make([]int, len(reads))
	for i, r := range reads {
		s.byOffset[i] = i
		s.longest = max(s.longest, int64(r.n))
	}
	slices.SortStableFunc(s.byOffset, func(a, b int) int {
		return cmp.Compare(reads[a].off, reads[b].off)
	})
	return s
}

// claim returns the rank of the next read to do, and whether it was the
// second pass (a read the cursor had jumped over) that found it; ok is
// false when every read has been claimed.
func (s *schedule) claim() (rank int, deferred, ok bool) {
	n := int64(len(s.reads))
	for s.cursor.Load() < n {
		i := s.cursor.Add(1) - 1
		if i < n && s.claimed[i].CompareAndSwap(false, true) {
			return int(i), false, true
		}
	}
	for {
		i := s.again.Add(1) - 1
		if i >= n {
			return 0, false, false
		}
		if s.claimed[i].CompareAndSwap(false, true) {
			return int(i), true, true
		}
	}
}

// followTo moves the cursor to the earliest-ranked read, at or after the
// cursor and not yet claimed, that overlaps [off, off+n): the guest asked
// for that memory, so its position in the plan is there. It reports
// whether the cursor moved. A request for memory already read or claimed,
// behind the cursor, or outside the plan changes nothing.
func (s *schedule) followTo(off, n int64) bool {
	if !s.follow || off < 0 || n <= 0 || off > math.MaxInt64-n {
		return false
	}
	for {
		from := s.cursor.Load()
		to, found := s.firstUnclaimedFrom(from, off, off+n)
		if !found || to <= from {
			return false
		}
		if s.cursor.CompareAndSwap(from, to) {
			return true
		}
		// A reader claimed a read, or another fault moved the cursor,
		// since from was loaded: look again from where it is now.
	}
}

// firstUnclaimedFrom returns the lowest rank at or after from of an
// unclaimed read overlapping [lo, hi).
func (s *schedule) firstUnclaimedFrom(from, lo, hi int64) (int64, bool) {
	reads := s.reads
	k := sort.Search(len(s.byOffset), func(k int) bool {
		return reads[s.byOffset[k]].off > lo-s.longest
	})
	best, found := int64(0), false
	for ; k < len(s.byOffset); k++ {
		rank := int64(s.byOffset[k])
		r := reads[rank]
		if r.off >= hi {
			break
		}
		if r.off+int64(r.n) <= lo || rank < from || (found && rank >= best) || s.claimed[rank].Load() {
			continue
		}
		best, found = rank, true
	}
	return best, found
}
