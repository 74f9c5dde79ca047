package layers

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// PageBytes is the size of a page: the unit a layer defines, a device
// serves and a digest table checks.
const PageBytes = 4096

// ErrBadPageMap is wrapped by every error of DecodePageMap and Validate.
var ErrBadPageMap = errors.New("malformed page map")

// Run is Count pages from page First on.
type Run struct {
	First, Count int64
}

// End is the page after the run.
func (r Run) End() int64 { return r.First + r.Count }

// PageMap says which pages of a memory a diff layer defines: Data runs are
// stored in the layer's data (slot k is the k-th data page in page order),
// Zero runs are pages that are all zero in this layer and store nothing.
// Pages in neither are defined by a layer below.
type PageMap struct {
	// MemorySize is the size of the memory the layer is part of; a
	// multiple of PageBytes.
	MemorySize int64
	// Data and Zero are sorted, non-empty, inside the memory, and no page
	// is in two runs (of either list).
	Data, Zero []Run
}

// Pages is the number of pages of the memory.
func (m *PageMap) Pages() int64 { return m.MemorySize / PageBytes }

// DataPages is the number of pages the layer stores.
func (m *PageMap) DataPages() int64 { return countPages(m.Data) }

// ZeroPages is the number of zero pages the layer defines.
func (m *PageMap) ZeroPages() int64 { return countPages(m.Zero) }

// DataBytes is the size of the layer's data: PageBytes per data page.
func (m *PageMap) DataBytes() int64 { return m.DataPages() * PageBytes }

func countPages(runs []Run) int64 {
	var n int64
	for _, r := range runs {
		n += r.Count
	}
	return n
}

// Validate checks the invariants of a page map.
func (m *PageMap) Validate() error {
	if m.MemorySize <= 0 || m.MemorySize%PageBytes != 0 || m.MemorySize > maxMemorySize {
		return fmt.Errorf("%w: memory size %d is not a positive multiple of %d up to %d", ErrBadPageMap, m.MemorySize, PageBytes, int64(maxMemorySize))
	}
	for _, runs := range [][]Run{m.Data, m.Zero} {
		if err := checkRuns(runs, m.Pages()); err != nil {
			return err
		}
	}
	return checkDisjoint(m.Data, m.Zero)
}

// maxMemorySize bounds the memories a page map describes (16 TiB), so
// page arithmetic never overflows and a chain's owner map stays bounded.
const maxMemorySize = 1 << 44

// checkRuns checks that runs are non-empty, sorted, apart and inside
// [0, pages).
func checkRuns(runs []Run, pages int64) error {
	next := int64(0)
	for i, r := range runs {
		switch {
		case r.Count <= 0:
			return fmt.Errorf("%w: run %d is empty", ErrBadPageMap, i)
		case r.First < next:
			return fmt.Errorf("%w: run %d (page %d) overlaps or precedes the run before it", ErrBadPageMap, i, r.First)
		case r.First > pages || r.Count > pages-r.First:
			return fmt.Errorf("%w: run %d [%d, +%d) is outside the memory's %d pages", ErrBadPageMap, i, r.First, r.Count, pages)
		}
		next = r.End()
	}
	return nil
}

// checkDisjoint checks that no page is in a run of both sorted lists.
func checkDisjoint(a, b []Run) error {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case a[i].End() <= b[j].First:
			i++
		case b[j].End() <= a[i].First:
			j++
		default:
			return fmt.Errorf("%w: page %d is both data and zero", ErrBadPageMap, max(a[i].First, b[j].First))
		}
	}
	return nil
}

// The encoding, little-endian, nothing after the last run:
//
//	0  magic "WSPGMAP\x00"
//	8  version (uint32, 1)
//	12 page bytes (uint32, 4096)
//	16 memory size (uint64)
//	24 data run count (uint64)
//	32 zero run count (uint64)
//	40 data runs, then zero runs: first page (uint64), count (uint64)
const (
	pageMapMagic   = "WSPGMAP\x00"
	pageMapVersion = 1
	pageMapHeader  = 40
	runBytes       = 16
)

// EncodedSize is the length of m's encoding.
func (m *PageMap) EncodedSize() int64 {
	return pageMapHeader + runBytes*int64(len(m.Data)+len(m.Zero))
}

// Encode returns m's stored form. m must be valid.
func (m *PageMap) Encode() []byte {
	out := make([]byte, m.EncodedSize())
	copy(out, pageMapMagic)
	binary.LittleEndian.PutUint32(out[8:], pageMapVersion)
	binary.LittleEndian.PutUint32(out[12:], PageBytes)
	binary.LittleEndian.PutUint64(out[16:], uint64(m.MemorySize))
	binary.LittleEndian.PutUint64(out[24:], uint64(len(m.Data)))
	binary.LittleEndian.PutUint64(out[32:], uint64(len(m.Zero)))
	at := pageMapHeader
	for _, r := range append(append([]Run(nil), m.Data...), m.Zero...) {
		binary.LittleEndian.PutUint64(out[at:], uint64(r.First))
		binary.LittleEndian.PutUint64(out[at+8:], uint64(r.Count))
		at += runBytes
	}
	return out
}

// DecodePageMap parses and validates an encoded page map. It allocates no
// more than the input's size, whatever the header claims.
func DecodePageMap(data []byte) (*PageMap, error) {
	if len(data) < pageMapHeader || string(data[:8]) != pageMapMagic {
		return nil, fmt.Errorf("%w: no header", ErrBadPageMap)
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v != pageMapVersion {
		return nil, fmt.Errorf("%w: version %d (this build reads %d)", ErrBadPageMap, v, pageMapVersion)
	}
	if pb := binary.LittleEndian.Uint32(data[12:]); pb != PageBytes {
		return nil, fmt.Errorf("%w: page size %d (this build uses %d)", ErrBadPageMap, pb, PageBytes)
	}
	size := binary.LittleEndian.Uint64(data[16:])
	nd, nz := binary.LittleEndian.Uint64(data[24:]), binary.LittleEndian.Uint64(data[32:])
	room := uint64(len(data)-pageMapHeader) / runBytes
	if size > maxMemorySize || nd > room || nz > room-nd || uint64(len(data)) != pageMapHeader+runBytes*(nd+nz) {
		return nil, fmt.Errorf("%w: %d bytes do not hold %d data and %d zero runs of a %d-byte memory", ErrBadPageMap, len(data), nd, nz, size)
	}
	pages := size / PageBytes
	data = data[pageMapHeader:]
	m := &PageMap{MemorySize: int64(size)}
	var err error
	if m.Data, err = decodeRuns("data", data, nd, pages); err != nil {
		return nil, err
	}
	if m.Zero, err = decodeRuns("zero", data[runBytes*nd:], nz, pages); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeRuns reads n runs of the named list from b, which holds at least
// n. It checks each run's stored (unsigned) fields against the memory's
// pages before they become int64s, so a field at or above 2^63 is refused
// with the value stored rather than the negative number it would wrap to.
func decodeRuns(list string, b []byte, n, pages uint64) ([]Run, error) {
	if n == 0 {
		return nil, nil
	}
	runs := make([]Run, n)
	for i := range runs {
		first := binary.LittleEndian.Uint64(b[i*runBytes:])
		count := binary.LittleEndian.Uint64(b[i*runBytes+8:])
		switch {
		case first >= pages:
			return nil, fmt.Errorf("%w: %s run %d: first page %d is not inside the memory's %d pages", ErrBadPageMap, list, i, first, pages)
		case count > pages-first:
			return nil, fmt.Errorf("%w: %s run %d: count %d from page %d passes the memory's %d pages", ErrBadPageMap, list, i, count, first, pages)
		}
		runs[i] = Run{First: int64(first), Count: int64(count)}
	}
	return runs, nil
}

// appendPage adds page to runs, which end before it, extending the last
// run when page follows it.
func appendPage(runs []Run, page int64) []Run {
	if n := len(runs); n > 0 && runs[n-1].End() == page {
		runs[n-1].Count++
		return runs
	}
	return append(runs, Run{First: page, Count: 1})
}
