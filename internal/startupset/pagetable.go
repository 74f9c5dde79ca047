package startupset

// Span gathers the pages a computation will index (with repeats), to size
// its PageTable. The zero Span is empty.
type Span struct {
	lo, hi int64 // pages [lo, hi)
	refs   int64
}

// Add notes the pages of the byte range [off, off+length): from page
// off/PageBytes while the page starts before the end, as every loop over
// a range's pages here counts them.
func (s *Span) Add(off, length int64) {
	first := off / PageBytes
	end := off + length
	if first*PageBytes >= end {
		return
	}
	last := first + (end-first*PageBytes-1)/PageBytes
	if s.refs == 0 || first < s.lo {
		s.lo = first
	}
	if s.refs == 0 || last >= s.hi {
		s.hi = last + 1
	}
	s.refs += last - first + 1
}

// denseFactor bounds a dense PageTable to this many slots per page the
// computation named (plus denseSlack): a table sized from the pages'
// span, never from the guest's memory size, and never much larger than
// the input, however far apart its pages lie (a guest of 64 GiB).
const (
	denseFactor = 16
	denseSlack  = 4096
)

// PageTable holds a value per page of guest memory, zero until set: a
// slice indexed by page over the span when the pages named are dense
// enough in it, and a map for the rest (all of them when sparse).
type PageTable[T any] struct {
	base   int64
	dense  []T
	sparse map[int64]*T
}

// NewPageTable makes a table for the pages of s.
func NewPageTable[T any](s Span) *PageTable[T] {
	t := &PageTable[T]{base: s.lo}
	if span := s.hi - s.lo; span > 0 && span <= denseFactor*s.refs+denseSlack {
		t.dense = make([]T, span)
	}
	return t
}

// At returns the page's value to read or set. The pointer stays valid for
// the table's life.
func (t *PageTable[T]) At(page int64) *T {
	if i := page - t.base; i >= 0 && i < int64(len(t.dense)) {
		return &t.dense[i]
	}
	v := t.sparse[page]
	if v == nil {
		v = new(T)
		if t.sparse == nil {
			t.sparse = map[int64]*T{}
		}
		t.sparse[page] = v
	}
	return v
}

// Get returns the page's value, zero when it was never set.
func (t *PageTable[T]) Get(page int64) T {
	if i := page - t.base; i >= 0 && i < int64(len(t.dense)) {
		return t.dense[i]
	}
	if v := t.sparse[page]; v != nil {
		return *v
	}
	var zero T
	return zero
}

// Pages is how many pages were added, counting repeats.
func (s Span) Pages() int64 { return s.refs }
