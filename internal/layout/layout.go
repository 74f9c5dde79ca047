// Package layout describes how a snapshot's guest memory is laid out in its
// memory file: a set of regions, each a run of the file mapped at a guest
// address with one page size. Every other package speaks of memory through
// it: the repository records a layout with each snapshot, a startup manifest
// is recorded against one, and a memory device or VMM maps regions by it.
//
// Offsets in warmstart are "logical": an offset into the memory file. A
// region maps file bytes [Offset, Offset+Size) into the guest.
package layout

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// DefaultPageSize is the host page size assumed when a layout spec omits it.
const DefaultPageSize = 4096

// MaxRegions is the most regions a layout may have. Real VMMs need few:
// Firecracker lays out an x86_64 guest in at most two regions (below and
// above the 32-bit MMIO gap at 3 GiB; one on aarch64), a few more with
// hotplugged memory, and QEMU's pc and q35 machines likewise. Every region
// is a KVM memory slot, and KVM gave an x86 VM at most 509 user slots
// (KVM_USER_MEM_SLOTS) until Linux 5.x; 256 leaves the VMM's own slots
// (ROM, MMIO, device memory) room below that. It also keeps a layout
// small enough to pass to a VMM process in one argument or environment
// string (Linux caps one at 128 KiB, MAX_ARG_STRLEN; 256 regions encode in
// about 15 KiB): a layout of thousands of regions failed only at restore,
// with "argument list too long".
const MaxRegions = 256

// ErrInvalid is wrapped by every error that rejects a layout.
var ErrInvalid = errors.New("invalid memory layout")

// Region is one guest memory region backed by a run of the memory file.
type Region struct {
	// Offset is the region's first byte in the memory file.
	Offset int64 `json:"offset"`
	// Size is the region's length in bytes, a multiple of PageSize.
	Size int64 `json:"size"`
	// PageSize is the host page size backing the region (4 KiB or a huge page size).
	PageSize int64 `json:"page_size"`
}

// End is one past the region's last byte in the memory file.
func (r Region) End() int64 { return r.Offset + r.Size }

// Layout is the memory layout of one snapshot.
type Layout struct {
	Regions []Region `json:"regions"`
	// FileSize is the size of the memory file in bytes.
	FileSize int64 `json:"memory_file_size"`
}

// Single is the layout of a guest with one region covering the whole file,
// which is what Firecracker writes for guests under 3 GiB.
func Single(size int64) Layout {
	return Layout{Regions: []Region{{Offset: 0, Size: size, PageSize: DefaultPageSize}}, FileSize: size}
}

// Validate checks that regions are page aligned, sorted, disjoint and inside
// the file. A layout that fails here must never be mapped: a region past the
// end of the file would fault with SIGBUS inside the VMM.
func (l Layout) Validate() error {
	if l.FileSize <= 0 {
		return fmt.Errorf("%w: memory file size %d is not positive", ErrInvalid, l.FileSize)
	}
	if len(l.Regions) == 0 {
		return fmt.Errorf("%w: no regions", ErrInvalid)
	}
	var prevEnd int64
	for i, r := range l.Regions {
		switch {
		case r.PageSize < DefaultPageSize || r.PageSize&(r.PageSize-1) != 0:
			return fmt.Errorf("%w: region %d: page size %d is not a power of two >= %d", ErrInvalid, i, r.PageSize, DefaultPageSize)
		case r.Size <= 0:
			return fmt.Errorf("%w: region %d: size %d is not positive", ErrInvalid, i, r.Size)
		case r.Offset < 0 || r.Offset%r.PageSize != 0 || r.Size%r.PageSize != 0:
			return fmt.Errorf("%w: region %d: offset %d or size %d not aligned to page size %d", ErrInvalid, i, r.Offset, r.Size, r.PageSize)
		case r.Offset < prevEnd:
			return fmt.Errorf("%w: region %d at offset %d overlaps or precedes the previous region ending at %d", ErrInvalid, i, r.Offset, prevEnd)
		case r.End() > l.FileSize || r.End() < r.Offset:
			return fmt.Errorf("%w: region %d [%d, %d) extends past the memory file size %d", ErrInvalid, i, r.Offset, r.End(), l.FileSize)
		}
		prevEnd = r.End()
	}
	return nil
}

// ValidateNew is Validate for a layout about to be published: it also
// refuses more than MaxRegions regions. Validate alone, which reading a
// stored record uses, does not, so a snapshot published before the limit
// still reads as it was.
func (l Layout) ValidateNew() error {
	if len(l.Regions) > MaxRegions {
		return fmt.Errorf("%w: %d regions, more than the %d a VMM maps", ErrInvalid, len(l.Regions), MaxRegions)
	}
	return l.Validate()
}

// Equal reports whether two layouts describe the same memory.
func (l Layout) Equal(o Layout) bool {
	if l.FileSize != o.FileSize || len(l.Regions) != len(o.Regions) {
		return false
	}
	for i := range l.Regions {
		if l.Regions[i] != o.Regions[i] {
			return false
		}
	}
	return true
}

// MappedSize is the number of bytes of the file the regions map.
func (l Layout) MappedSize() int64 {
	var n int64
	for _, r := range l.Regions {
		n += r.Size
	}
	return n
}

// RegionAt returns the index of the region holding logical offset off.
func (l Layout) RegionAt(off int64) (int, bool) {
	i := sort.Search(len(l.Regions), func(i int) bool { return l.Regions[i].End() > off })
	if i < len(l.Regions) && l.Regions[i].Offset <= off {
		return i, true
	}
	return 0, false
}

// Contains reports whether [off, off+length) lies inside one region.
func (l Layout) Contains(off, length int64) bool {
	if length <= 0 || off < 0 {
		return false
	}
	i, ok := l.RegionAt(off)
	return ok && off+length <= l.Regions[i].End() && off+length > off
}

// String renders the layout in the form Parse reads.
func (l Layout) String() string {
	parts := make([]string, len(l.Regions))
	for i, r := range l.Regions {
		parts[i] = fmt.Sprintf("%d:%d:%d", r.Offset, r.Size, r.PageSize)
	}
	return strings.Join(parts, ",")
}

// Parse reads a layout spec: comma-separated regions "offset:size[:pagesize]"
// in bytes (suffixes K, M, G, KiB, MiB, GiB accepted), for a memory file of
// fileSize bytes. An empty spec means one region covering the whole file.
func Parse(spec string, fileSize int64) (Layout, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		l := Single(fileSize)
		return l, l.Validate()
	}
	parts := strings.Split(spec, ",")
	if len(parts) > MaxRegions {
		// Refused before parsing: the count alone says no.
		return Layout{}, fmt.Errorf("%w: %d regions, more than the %d a VMM maps", ErrInvalid, len(parts), MaxRegions)
	}
	l := Layout{FileSize: fileSize}
	for i, part := range parts {
		fields := strings.Split(strings.TrimSpace(part), ":")
		if len(fields) < 2 || len(fields) > 3 {
			return Layout{}, fmt.Errorf("%w: region %d %q: want offset:size[:pagesize]", ErrInvalid, i, part)
		}
		var vals [3]int64
		vals[2] = DefaultPageSize
		for j, f := range fields {
			v, err := ParseSize(f)
			if err != nil {
				return Layout{}, fmt.Errorf("%w: region %d %q: %v", ErrInvalid, i, part, err)
			}
			vals[j] = v
		}
		l.Regions = append(l.Regions, Region{Offset: vals[0], Size: vals[1], PageSize: vals[2]})
	}
	return l, l.Validate()
}

// ParseSize reads a byte count such as "4096", "128MiB" or "2G".
// Binary multiples are used for every suffix.
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, suf := range []struct {
		name string
		mult int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}} {
		if strings.HasSuffix(s, suf.name) {
			s, mult = strings.TrimSuffix(s, suf.name), suf.mult
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	if v > (1<<62)/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return v * mult, nil
}
