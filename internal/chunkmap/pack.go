package chunkmap

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// DefaultFrameBytes is the logical size of one startup pack frame: the
// unit a reader decodes and checks, and so the unit in which a streaming
// pack's pages reach a guest waiting for them (the chunk cache hands a
// block's checked leading bytes to its waiters as they arrive). A 1 MiB
// frame, one per cache block, held a guest that caught up with the stream
// until the whole block was in (33 ms at a quarter of a 1 Gbit/s link);
// 256 KiB frames cut that to 8 ms. They compress as well (the reference
// stores 0.562-0.564x of raw from 256 KiB to 4 MiB units), and the index
// grows to 36 bytes per 256 KiB.
const DefaultFrameBytes = 256 << 10

// Frame is one independently compressed frame of a startup pack.
type Frame struct {
	Digest      Digest // of its uncompressed bytes
	StoredBytes int64
	// Offset is where it starts in the pack object (the sum of the stored
	// sizes of the frames before it).
	Offset int64
}

// PackIndex describes a startup pack object: the pages of the startup
// manifest whose SHA-256 is ManifestSHA256, range after range in the
// manifest's (first-touch) order, LogicalBytes in all, cut into frames of
// FrameBytes, each compressed on its own and stored back to back.
//
// Ranges, when set, are the memory ranges the pack holds, in pack order
// (the index is then self-describing, format 2): a reader maps memory onto
// the pack from the index alone, so a pack built from one manifest serves
// the pages it holds to a restore prefetching another (a newer refinement
// of the same snapshot). A format-1 index has none, and is read with the
// manifest it was built from.
type PackIndex struct {
	ManifestSHA256 Digest
	FrameBytes     int64
	LogicalBytes   int64
	Ranges         []PackRange
	Frames         []Frame
}

// PackRange is memory [Offset, Offset+Length) held in a pack.
type PackRange struct {
	Offset, Length int64
}

// FrameLength is the logical length of frame i.
func (p PackIndex) FrameLength(i int) int64 {
	return min(p.FrameBytes, p.LogicalBytes-int64(i)*p.FrameBytes)
}

// StoredBytes is the pack object's size.
func (p PackIndex) StoredBytes() int64 {
	if len(p.Frames) == 0 {
		return 0
	}
	last := p.Frames[len(p.Frames)-1]
	return last.Offset + last.StoredBytes
}

const (
	packMagicV1     = "WSPACK01"
	packMagicV2     = "WSPACK02"
	packHeaderBytes = 8 + sha256.Size + 8 + 8 + 4
	packEntryBytes  = sha256.Size + 4
	packRangeBytes  = 8 + 8
	// maxPackRanges bounds a format-2 index's range count (a manifest's
	// ranges are bounded the same way, by its 16 MiB encoding).
	maxPackRanges = 1 << 20
)

// Encode is the index's binary form: magic, manifest digest, frame size,
// logical size, frame count, then (format 2, when Ranges is set) the range
// count and each range's memory offset and length, then per frame its
// digest and stored size.
func (p PackIndex) Encode() []byte {
	out := make([]byte, 0, packHeaderBytes+4+len(p.Ranges)*packRangeBytes+len(p.Frames)*packEntryBytes)
	magic := packMagicV1
	if p.Ranges != nil {
		magic = packMagicV2
	}
	out = append(out, magic...)
	out = append(out, p.ManifestSHA256[:]...)
	out = binary.LittleEndian.AppendUint64(out, uint64(p.FrameBytes))
	out = binary.LittleEndian.AppendUint64(out, uint64(p.LogicalBytes))
	out = binary.LittleEndian.AppendUint32(out, uint32(len(p.Frames)))
	if p.Ranges != nil {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(p.Ranges)))
		for _, r := range p.Ranges {
			out = binary.LittleEndian.AppendUint64(out, uint64(r.Offset))
			out = binary.LittleEndian.AppendUint64(out, uint64(r.Length))
		}
	}
	for _, f := range p.Frames {
		out = append(out, f.Digest[:]...)
		out = binary.LittleEndian.AppendUint32(out, uint32(f.StoredBytes))
	}
	return out
}

// DecodePack parses an encoded pack index (format 1 or 2) and checks
// every field.
func DecodePack(data []byte) (PackIndex, error) {
	if len(data) < packHeaderBytes || (string(data[:8]) != packMagicV1 && string(data[:8]) != packMagicV2) {
		return PackIndex{}, errors.New("pack index: bad magic or truncated header")
	}
	p, count, err := decodePackHeader(data)
	if err != nil {
		return PackIndex{}, err
	}
	entries := data[packHeaderBytes:]
	if string(data[:8]) == packMagicV2 {
		if p.Ranges, entries, err = decodePackRanges(entries, p.LogicalBytes); err != nil {
			return PackIndex{}, err
		}
	}
	if uint64(len(entries)) != count*packEntryBytes {
		return PackIndex{}, fmt.Errorf("pack index: %d bytes of frame entries, want %d for %d frames", len(entries), count*packEntryBytes, count)
	}
	p.Frames = make([]Frame, count)
	var off int64
	for i := range p.Frames {
		e := entries[i*packEntryBytes:]
		f := &p.Frames[i]
		copy(f.Digest[:], e)
		f.StoredBytes = int64(binary.LittleEndian.Uint32(e[sha256.Size:]))
		if f.StoredBytes <= 0 || f.StoredBytes > MaxChunkBytes*2 {
			return PackIndex{}, fmt.Errorf("pack index: frame %d: stored_bytes %d out of range", i, f.StoredBytes)
		}
		f.Offset = off
		off += f.StoredBytes
	}
	return p, nil
}

// decodePackHeader reads the header of an encoded pack index, which holds
// one whole: the index's manifest digest, frame and logical sizes, and its
// frame count. The sizes are unsigned: they are checked as stored.
func decodePackHeader(data []byte) (p PackIndex, count uint64, err error) {
	copy(p.ManifestSHA256[:], data[8:])
	h := data[8+sha256.Size:]
	frameBytes, logicalBytes := binary.LittleEndian.Uint64(h), binary.LittleEndian.Uint64(h[8:])
	count = uint64(binary.LittleEndian.Uint32(h[16:]))
	switch {
	case frameBytes < 4096 || frameBytes > MaxChunkBytes || frameBytes%4096 != 0:
		return p, 0, fmt.Errorf("pack index: frame_bytes %d is not a multiple of 4096 in 4 KiB..%d", frameBytes, MaxChunkBytes)
	case logicalBytes == 0 || logicalBytes > math.MaxInt64 || count != logicalBytes/frameBytes+min(logicalBytes%frameBytes, 1):
		return p, 0, fmt.Errorf("pack index: count %d does not cover logical_bytes %d", count, logicalBytes)
	}
	p.FrameBytes, p.LogicalBytes = int64(frameBytes), int64(logicalBytes)
	return p, count, nil
}

// decodePackRanges reads a format-2 index's ranges from data and returns
// them and the rest of data. The ranges must be page aligned, disjoint and
// cover exactly logicalBytes.
func decodePackRanges(data []byte, logicalBytes int64) ([]PackRange, []byte, error) {
	if len(data) < 4 {
		return nil, nil, errors.New("pack index: truncated range count")
	}
	n := int64(binary.LittleEndian.Uint32(data))
	data = data[4:]
	if n <= 0 || n > maxPackRanges || int64(len(data)) < n*packRangeBytes {
		return nil, nil, fmt.Errorf("pack index: range count %d is outside 1..%d or truncated", n, maxPackRanges)
	}
	rs := make([]PackRange, n)
	var total int64
	for i := range rs {
		r, err := decodePackRange(data[int64(i)*packRangeBytes:], logicalBytes)
		if err != nil {
			return nil, nil, fmt.Errorf("pack index: range %d: %w", i, err)
		}
		rs[i], total = r, total+r.Length
	}
	if total != logicalBytes {
		return nil, nil, fmt.Errorf("pack index: ranges hold %d bytes, logical_bytes %d", total, logicalBytes)
	}
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b PackRange) int { return cmp.Compare(a.Offset, b.Offset) })
	for i := 1; i < len(sorted); i++ {
		if sorted[i].Offset < sorted[i-1].Offset+sorted[i-1].Length {
			return nil, nil, fmt.Errorf("pack index: ranges overlap at %d", sorted[i].Offset)
		}
	}
	return rs, data[n*packRangeBytes:], nil
}

// decodePackRange reads one stored range from e. Its fields are unsigned:
// they are checked before they become int64s, so a value at or above 2^63
// is refused as stored, and so is a range whose end passes the int64 range.
func decodePackRange(e []byte, logicalBytes int64) (PackRange, error) {
	off, length := binary.LittleEndian.Uint64(e), binary.LittleEndian.Uint64(e[8:])
	switch {
	case length == 0 || length%4096 != 0 || length > uint64(logicalBytes):
		return PackRange{}, fmt.Errorf("length %d is not a page multiple in 4 KiB..logical_bytes %d", length, logicalBytes)
	case off%4096 != 0 || off > math.MaxInt64-length:
		return PackRange{}, fmt.Errorf("offset %d (length %d) is not page aligned or ends beyond %d", off, length, int64(math.MaxInt64))
	}
	return PackRange{Offset: int64(off), Length: int64(length)}, nil
}

// BuildPack compresses logical (the startup set's bytes in pack order)
// into frames and returns the pack object and its index. ranges, when not
// nil, are the memory ranges logical holds, in order (a format-2 index).
func BuildPack(manifestSHA256 Digest, logical []byte, frameBytes int64, ranges ...PackRange) ([]byte, PackIndex) {
	idx := PackIndex{ManifestSHA256: manifestSHA256, FrameBytes: frameBytes, LogicalBytes: int64(len(logical)), Ranges: ranges}
	var obj []byte
	for off := int64(0); off < int64(len(logical)); off += frameBytes {
		frame := logical[off:min(off+frameBytes, int64(len(logical)))]
		stored := Compress(frame)
		idx.Frames = append(idx.Frames, Frame{Digest: Sum(frame), StoredBytes: int64(len(stored)), Offset: int64(len(obj))})
		obj = append(obj, stored...)
	}
	return obj, idx
}
