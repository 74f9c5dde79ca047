// Package manifest is the startup manifest: the memory ranges a restore of
// one snapshot touched, in first-touch order, until its guest agent was
// ready. A recorder builds it from a memory device's trace, the repository
// stores it next to the snapshot with a SHA-256 descriptor, and a restore
// prefetches its ranges.
//
// A manifest is untrusted input on the restore path: it may be stale,
// truncated or corrupt. Decode and Verify reject every such file with a
// specific sentinel error, never panic, and never allocate more than the
// input's own size, so the caller can fall back to on-demand reads.
//
// Encoding, version 1, all integers little-endian:
//
//	magic        8 bytes  "WSMANIF\x00"
//	version      uint32   1
//	region count uint32   R
//	file size    uint64   memory file size in bytes
//	regions      R × (offset uint64, size uint64, page size uint64)
//	range count  uint64   N
//	ranges       N × (logical offset uint64, length uint64), first-touch order
//
// Nothing may follow the last range. There is no checksum inside the file:
// the SHA-256 digest of the whole encoding, kept in the snapshot record, is
// the integrity check.
package manifest

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"warmstart/internal/layout"
	"warmstart/internal/untrusted"
)

// Version is the encoding version this package writes and reads.
const Version = 1

// MaxEncodedBytes caps an encoded manifest. It bounds what a restore reads,
// hashes and validates before it can start prefetching.
const MaxEncodedBytes = 16 << 20

// Magic opens every encoded manifest.
var Magic = [8]byte{'W', 'S', 'M', 'A', 'N', 'I', 'F', 0}

const (
	headerBytes     = 8 + 4 + 4 + 8 // magic, version, region count, file size
	regionBytes     = 3 * 8
	rangeCountBytes = 8
	rangeBytes      = 2 * 8
)

// Sentinel errors; every rejection wraps exactly one of them (or
// layout.ErrInvalid for a bad embedded layout) with the detail.
var (
	ErrTruncated          = errors.New("manifest truncated")
	ErrTrailingData       = errors.New("manifest has data after its last range")
	ErrBadMagic           = errors.New("not a startup manifest (bad magic number)")
	ErrUnsupportedVersion = errors.New("unsupported manifest version")
	ErrOverlap            = errors.New("manifest ranges overlap")
	ErrUnaligned          = errors.New("manifest range not page aligned")
	ErrOutsideLayout      = errors.New("manifest range outside the memory layout")
	ErrOversize           = errors.New("manifest too large")
	ErrDigestMismatch     = errors.New("manifest digest mismatch")
	ErrSizeMismatch       = errors.New("manifest size mismatch")
	ErrLayoutMismatch     = errors.New("manifest recorded against another memory layout")
)

// Range is a run of memory by logical offset (offset in the memory file).
type Range struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// End is one past the range's last byte.
func (r Range) End() int64 { return r.Offset + r.Length }

// Manifest is a decoded startup manifest.
type Manifest struct {
	// Layout is the memory layout the manifest was recorded against; a
	// restore uses the manifest only on a snapshot with the same layout.
	Layout layout.Layout
	// Ranges are in first-touch order, the order prefetch reads them in.
	Ranges []Range
}

// TotalBytes is the number of bytes the ranges cover.
func (m *Manifest) TotalBytes() int64 {
	var n int64
	for _, r := range m.Ranges {
		n += r.Length
	}
	return n
}

// encodedSize is the length of an encoding with these counts, or -1 when
// it would exceed MaxEncodedBytes (checked without overflow for any counts).
func encodedSize(regions, ranges int) int64 {
	const limit = MaxEncodedBytes
	if regions < 0 || ranges < 0 || regions > limit/regionBytes || ranges > limit/rangeBytes {
		return -1
	}
	n := int64(headerBytes + regions*regionBytes + rangeCountBytes + ranges*rangeBytes)
	if n > limit {
		return -1
	}
	return n
}

// Validate checks the layout and every range: page aligned to its region's
// page size, inside one region, no two overlapping, and the whole within
// MaxEncodedBytes encoded and the memory file's size covered.
func (m *Manifest) Validate() error {
	if err := m.Layout.Validate(); err != nil {
		return fmt.Errorf("manifest layout: %w", err)
	}
	if encodedSize(len(m.Layout.Regions), len(m.Ranges)) < 0 {
		return fmt.Errorf("%w: %d regions and %d ranges encode to more than %d bytes",
			ErrOversize, len(m.Layout.Regions), len(m.Ranges), MaxEncodedBytes)
	}
	for i, r := range m.Ranges {
		if err := m.checkRange(i, r); err != nil {
			return err
		}
	}
	if err := checkOverlap(m.Ranges); err != nil {
		return err
	}
	// Disjoint ranges inside disjoint regions cannot cover more than the
	// file; the check stays as the format's stated bound.
	if total := m.TotalBytes(); total > m.Layout.FileSize {
		return fmt.Errorf("%w: ranges cover %d bytes, more than the memory file's %d", ErrOversize, total, m.Layout.FileSize)
	}
	return nil
}

func (m *Manifest) checkRange(i int, r Range) error {
	if r.Length <= 0 || r.Offset < 0 {
		return fmt.Errorf("%w: range %d (offset %d, length %d) is empty or negative", ErrOutsideLayout, i, r.Offset, r.Length)
	}
	ri, ok := m.Layout.RegionAt(r.Offset)
	if !ok {
		return fmt.Errorf("%w: range %d at offset %d is in no region of layout %s", ErrOutsideLayout, i, r.Offset, m.Layout)
	}
	reg := m.Layout.Regions[ri]
	if r.Offset%reg.PageSize != 0 || r.Length%reg.PageSize != 0 {
		return fmt.Errorf("%w: range %d (offset %d, length %d) in region %d with page size %d",
			ErrUnaligned, i, r.Offset, r.Length, ri, reg.PageSize)
	}
	if r.Length > reg.End()-r.Offset {
		return fmt.Errorf("%w: range %d (offset %d, length %d) runs past the end %d of region %d",
			ErrOutsideLayout, i, r.Offset, r.Length, reg.End(), ri)
	}
	return nil
}

// checkOverlap sorts a copy of the ranges by offset and compares each with
// its predecessor: O(n log n) for manifests of 10^5 ranges.
func checkOverlap(ranges []Range) error {
	type indexed struct {
		Range
		index int
	}
	sorted := make([]indexed, len(ranges))
	for i, r := range ranges {
		sorted[i] = indexed{r, i}
	}
	slices.SortFunc(sorted, func(a, b indexed) int {
		return cmp.Or(cmp.Compare(a.Offset, b.Offset), cmp.Compare(a.index, b.index))
	})
	for k := 1; k < len(sorted); k++ {
		prev, cur := sorted[k-1], sorted[k]
		if cur.Offset < prev.End() {
			return fmt.Errorf("%w: range %d [%d, %d) and range %d [%d, %d)",
				ErrOverlap, prev.index, prev.Offset, prev.End(), cur.index, cur.Offset, cur.End())
		}
	}
	return nil
}

// Encode validates m and returns its encoding.
func Encode(m *Manifest) ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	buf := make([]byte, 0, encodedSize(len(m.Layout.Regions), len(m.Ranges)))
	buf = append(buf, Magic[:]...)
	buf = binary.LittleEndian.AppendUint32(buf, Version)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(m.Layout.Regions)))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(m.Layout.FileSize))
	for _, r := range m.Layout.Regions {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Offset))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Size))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(r.PageSize))
	}
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(m.Ranges)))
	for _, r := range m.Ranges {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Offset))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(r.Length))
	}
	return buf, nil
}

// Decode parses and validates an encoded manifest.
func Decode(data []byte) (*Manifest, error) {
	if len(data) > MaxEncodedBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrOversize, len(data), MaxEncodedBytes)
	}
	if len(data) < len(Magic) {
		if strings.HasPrefix(string(Magic[:]), string(data)) {
			return nil, fmt.Errorf("%w: %d bytes, shorter than the magic number", ErrTruncated, len(data))
		}
		return nil, fmt.Errorf("%w: %q", ErrBadMagic, data)
	}
	if [8]byte(data[:8]) != Magic {
		return nil, fmt.Errorf("%w: %q", ErrBadMagic, data[:8])
	}
	if len(data) < headerBytes {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrTruncated, len(data), headerBytes)
	}
	le := binary.LittleEndian
	if v := le.Uint32(data[8:]); v != Version {
		return nil, fmt.Errorf("%w: %d (this build reads %d)", ErrUnsupportedVersion, v, Version)
	}
	regionCount := uint64(le.Uint32(data[12:]))
	rest := data[headerBytes:]

	// Counts are untrusted: compare them with the bytes actually present
	// before allocating anything they size.
	if regionCount > uint64(len(rest))/regionBytes {
		return nil, fmt.Errorf("%w: header announces %d regions, %d bytes remain", ErrTruncated, regionCount, len(rest))
	}
	var fr fieldReader
	l := layout.Layout{FileSize: fr.int64(data[16:], layout.ErrInvalid, "memory file size"), Regions: make([]layout.Region, regionCount)}
	for i := range l.Regions {
		l.Regions[i] = layout.Region{
			Offset:   fr.int64(rest[0:], layout.ErrInvalid, "region %d: offset", i),
			Size:     fr.int64(rest[8:], layout.ErrInvalid, "region %d: size", i),
			PageSize: fr.int64(rest[16:], layout.ErrInvalid, "region %d: page size", i),
		}
		rest = rest[regionBytes:]
	}
	if len(rest) < rangeCountBytes {
		return nil, fmt.Errorf("%w: no range count after %d regions", ErrTruncated, regionCount)
	}
	rangeCount := le.Uint64(rest)
	rest = rest[rangeCountBytes:]
	switch have := uint64(len(rest)) / rangeBytes; {
	case rangeCount > have:
		return nil, fmt.Errorf("%w: %d ranges announced, bytes for %d remain", ErrTruncated, rangeCount, have)
	case uint64(len(rest)) != rangeCount*rangeBytes:
		return nil, fmt.Errorf("%w: %d bytes after range %d", ErrTrailingData, uint64(len(rest))-rangeCount*rangeBytes, rangeCount)
	}
	m := &Manifest{Layout: l, Ranges: make([]Range, rangeCount)}
	for i := range m.Ranges {
		m.Ranges[i] = Range{
			Offset: fr.int64(rest[0:], ErrOutsideLayout, "range %d: offset", i),
			Length: fr.int64(rest[8:], ErrOutsideLayout, "range %d: length", i),
		}
		rest = rest[rangeBytes:]
	}
	if fr.err != nil {
		return nil, fr.err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// fieldReader reads the format's offsets and sizes, stored unsigned, into
// int64s. It keeps the first above math.MaxInt64 as its err: no memory
// file has such an offset or size, and the error names the value as the
// file stores it (a hex dump shows it), never as the negative number the
// conversion would make of it.
type fieldReader struct{ err error }

// int64 reads the little-endian field at the start of b; sentinel and the
// format (with args) name it in err.
func (f *fieldReader) int64(b []byte, sentinel error, format string, args ...any) int64 {
	v := binary.LittleEndian.Uint64(b)
	if v > math.MaxInt64 {
		if f.err == nil {
			f.err = fmt.Errorf("%w: %s %d is beyond any memory file (at most %d)",
				sentinel, fmt.Sprintf(format, args...), v, int64(math.MaxInt64))
		}
		return 0
	}
	return int64(v)
}

// Digest is the lowercase hex SHA-256 of an encoded manifest.
func Digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Descriptor identifies an encoded manifest; a snapshot record stores it
// when the manifest is attached.
type Descriptor struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Describe returns the descriptor of an encoded manifest.
func Describe(data []byte) Descriptor {
	return Descriptor{SHA256: Digest(data), Size: int64(len(data))}
}

// Verify checks an encoded manifest against the descriptor recorded with
// its snapshot, decodes it and checks it was recorded against the
// snapshot's memory layout. Any error means: do not prefetch.
func Verify(data []byte, want Descriptor, snapshotLayout layout.Layout) (*Manifest, error) {
	if len(data) > MaxEncodedBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrOversize, len(data), MaxEncodedBytes)
	}
	if int64(len(data)) != want.Size {
		return nil, fmt.Errorf("%w: %d bytes, descriptor says %d", ErrSizeMismatch, len(data), want.Size)
	}
	if got := Digest(data); got != strings.ToLower(want.SHA256) {
		return nil, fmt.Errorf("%w: sha256 %s, descriptor says %s", ErrDigestMismatch, got, want.SHA256)
	}
	m, err := Decode(data)
	if err != nil {
		return nil, err
	}
	if !m.Layout.Equal(snapshotLayout) {
		return nil, fmt.Errorf("%w: manifest has %s over %d bytes, snapshot has %s over %d bytes",
			ErrLayoutMismatch, m.Layout, m.Layout.FileSize, snapshotLayout, snapshotLayout.FileSize)
	}
	return m, nil
}

// ReadFile reads an encoded manifest, refusing one over MaxEncodedBytes
// without reading it whole. Anything but a regular file is refused at once
// with an error wrapping untrusted.ErrNotRegular: a FIFO would block the restore
// in open(2), a device would stream without end, a symlink would point the
// restore at whatever it names.
func ReadFile(path string) ([]byte, error) {
	data, err := untrusted.ReadBounded(path, MaxEncodedBytes)
	if errors.Is(err, untrusted.ErrTooLarge) {
		return nil, fmt.Errorf("%s: %w: more than %d bytes", path, ErrOversize, MaxEncodedBytes)
	}
	return data, err
}

// Build turns page first-touch offsets, in touch order, into a manifest
// for layout l. Each offset is rounded down to its region's page; a page
// seen before is dropped; a page directly after the previous range, in the
// same region, extends that range, so sequential runs become one range.
func Build(l layout.Layout, pageOffsets []int64) (*Manifest, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	m := &Manifest{Layout: l}
	seen := make(map[int64]struct{}, len(pageOffsets))
	lastRegion := -1
	for i, off := range pageOffsets {
		ri, ok := l.RegionAt(off)
		if !ok || off < 0 {
			return nil, fmt.Errorf("%w: touch %d at offset %d is in no region of layout %s", ErrOutsideLayout, i, off, l)
		}
		ps := l.Regions[ri].PageSize
		page := off - off%ps
		if _, dup := seen[page]; dup {
			continue
		}
		seen[page] = struct{}{}
		if n := len(m.Ranges); n > 0 && ri == lastRegion && m.Ranges[n-1].End() == page {
			m.Ranges[n-1].Length += ps
			continue
		}
		m.Ranges = append(m.Ranges, Range{Offset: page, Length: ps})
		lastRegion = ri
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}
