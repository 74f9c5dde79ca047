// Package integrity keeps a digest for every fixed-size block of a
// snapshot's memory file, and checks blocks against them before a memory
// device lets any byte of them reach a VMM.
//
// The digest is CRC-32C over 4 KiB blocks. Its job is bit rot, torn or
// misplaced writes and a file swapped for another, not an adversary: an
// adversary who can write the store can rewrite the table too, which is why
// the table itself is an artifact whose SHA-256 is in the snapshot's record
// next to the whole-file SHA-256. CRC-32C runs at about 18 GB/s per core
// here with the CPU's instruction (SHA-256: 1.7 GB/s), so checking a
// restore's 40 MiB working set costs about 2 ms of CPU. 4 KiB is the page
// every device reads in (a uffd fault, a FUSE page), so a check never reads
// more than the device was asked for, and a bad block costs the guest only
// the page it lies in; the table is 1/1024 of the memory file.
package integrity

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// BlockBytes is the size of a digested block. The last block of a file may
// be shorter.
const BlockBytes = 4096

// Algorithm names the digest in records and on the wire.
const Algorithm = "crc32c-4k"

// Errors a Table reports. ErrCorrupt is what a reader of bad bytes gets;
// the others describe a table that cannot be used.
var (
	ErrCorrupt     = errors.New("memory block does not match its digest")
	ErrBadTable    = errors.New("malformed digest table")
	ErrSizeChanged = errors.New("digest table is for a file of another size")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Table holds the digest of every block of one file.
type Table struct {
	fileSize int64
	sums     []uint32
}

// FileSize is the size of the file the table describes.
func (t *Table) FileSize() int64 { return t.fileSize }

// Blocks is the number of blocks.
func (t *Table) Blocks() int { return len(t.sums) }

// blockLen is the length of block i.
func (t *Table) blockLen(i int) int {
	return int(min(BlockBytes, t.fileSize-int64(i)*BlockBytes))
}

func blocksFor(size int64) int { return int((size + BlockBytes - 1) / BlockBytes) }

// Encoding: a 24-byte header, then one little-endian uint32 per block.
//
//	0  magic "WSBD"
//	4  version (uint16, 1)
//	6  algorithm (uint16, 1 = CRC-32C)
//	8  block bytes (uint32, 4096)
//	12 reserved (uint32, 0)
//	16 file size (uint64)
const (
	headerBytes  = 24
	magic        = "WSBD"
	version      = 1
	algorithmCRC = 1
)

// EncodedSize is the length of the encoding of a table for a file of size
// bytes; a reader checks it before reading a table file.
func EncodedSize(size int64) int64 { return headerBytes + 4*int64(blocksFor(size)) }

// Encode returns the table's stored form.
func (t *Table) Encode() []byte {
	out := make([]byte, headerBytes+4*len(t.sums))
	copy(out, magic)
	binary.LittleEndian.PutUint16(out[4:], version)
	binary.LittleEndian.PutUint16(out[6:], algorithmCRC)
	binary.LittleEndian.PutUint32(out[8:], BlockBytes)
	binary.LittleEndian.PutUint64(out[16:], uint64(t.fileSize))
	for i, s := range t.sums {
		binary.LittleEndian.PutUint32(out[headerBytes+4*i:], s)
	}
	return out
}

// Decode parses a table and checks that it describes a file of fileSize
// bytes.
func Decode(data []byte, fileSize int64) (*Table, error) {
	if len(data) < headerBytes || string(data[:4]) != magic {
		return nil, fmt.Errorf("%w: no header", ErrBadTable)
	}
	if v := binary.LittleEndian.Uint16(data[4:]); v != version {
		return nil, fmt.Errorf("%w: version %d (this build reads %d)", ErrBadTable, v, version)
	}
	if a := binary.LittleEndian.Uint16(data[6:]); a != algorithmCRC {
		return nil, fmt.Errorf("%w: unknown algorithm %d", ErrBadTable, a)
	}
	if bs := binary.LittleEndian.Uint32(data[8:]); bs != BlockBytes {
		return nil, fmt.Errorf("%w: block size %d (this build uses %d)", ErrBadTable, bs, BlockBytes)
	}
	size := binary.LittleEndian.Uint64(data[16:])
	if size > 1<<50 || int64(size) != fileSize {
		return nil, fmt.Errorf("%w: table is for %d bytes, file has %d", ErrSizeChanged, size, fileSize)
	}
	if int64(len(data)) != EncodedSize(fileSize) {
		return nil, fmt.Errorf("%w: %d bytes, want %d for a %d-byte file", ErrBadTable, len(data), EncodedSize(fileSize), fileSize)
	}
	t := &Table{fileSize: fileSize, sums: make([]uint32, blocksFor(fileSize))}
	for i := range t.sums {
		t.sums[i] = binary.LittleEndian.Uint32(data[headerBytes+4*i:])
	}
	return t, nil
}

// BlockError names one block whose bytes do not match the table. It
// matches ErrCorrupt with errors.Is.
type BlockError struct {
	// Offset is the block's offset in the file.
	Offset int64
	// Want is the table's digest, Got the digest of the bytes read.
	Want, Got uint32
}

func (e *BlockError) Error() string {
	return fmt.Sprintf("block at offset %d (%d bytes): CRC-32C %08x, table says %08x: %v",
		e.Offset, BlockBytes, e.Got, e.Want, ErrCorrupt)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *BlockError) Is(target error) bool { return target == ErrCorrupt }

// check verifies data, which holds the file's bytes from off, a block
// boundary. Only whole blocks (or the file's short last block) are checked;
// it returns how many leading bytes of data lie in blocks that passed, and
// the first bad block, if any.
func (t *Table) check(data []byte, off int64) (int, *BlockError) {
	done := 0
	for i := int(off / BlockBytes); i < len(t.sums); i++ {
		n := t.blockLen(i)
		if done+n > len(data) {
			break
		}
		if got := checksum(data[done : done+n]); got != t.sums[i] {
			return done, &BlockError{Offset: int64(i) * BlockBytes, Want: t.sums[i], Got: got}
		}
		done += n
	}
	return done, nil
}

// Mismatches compares t with the table of another reading of the same file
// and returns the offsets of the blocks that differ.
func (t *Table) Mismatches(read *Table) []int64 {
	var bad []int64
	for i := range t.sums {
		if i >= len(read.sums) || read.sums[i] != t.sums[i] {
			bad = append(bad, int64(i)*BlockBytes)
		}
	}
	return bad
}
