// Package integrity keeps digests of every fixed-size block of a
// snapshot's memory file, and checks blocks against them before a memory
// device lets any byte of them reach a VMM.
//
// A publish stores two tables of 4 KiB blocks, built in the pass that
// hashes the memory file: one of CRC-32C digests (CRC32C) and one of
// SHA-256 digests (SHA256). A device checks every block it serves against
// one of them, chosen by who could have changed the bytes (package
// restore):
//
//   - SHA-256 where the table is anchored in something a writer of the
//     bytes cannot change: a record signed by a key the node trusts
//     (package trust), or memory served from a node cache while the table
//     comes from the store (s3). A CRC is affine: a 16-byte patch with a
//     4-byte fix-up keeps any block's CRC-32C, so only a digest no one can
//     make other bytes match stops a writer there.
//   - CRC-32C everywhere else: where whoever can change the bytes can
//     change the table and the record with them (a POSIX store read by a
//     node that trusts no key), SHA-256 stops nothing CRC-32C does not;
//     CRC-32C still catches bit rot, torn or misplaced writes and swapped
//     files, and costs a tenth as much. It also stays in the node cache's
//     block file names (package chunkcache), as a first check for torn
//     writes and media errors.
//
// Cost, measured here (Xeon with SHA-NI, 2 cores shared with other work):
// `go test -bench BlockDigest` gives CRC-32C 7–9 GB/s and SHA-256
// 0.2–0.7 GB/s per 4 KiB block at a load average of ~12 (unloaded, about
// 14 and 1.7 GB/s). A restore of the reference reads 48.5 MiB. `warmstart
// bench --policies warmstart,warmstart+noverify` with every block checked
// by SHA-256 measured verified minus unverified at +16 ms cold and +10 ms
// warm of ~200 ms (12 blocks, load ~4; medians 9–15 % apart), and +68 ms
// and +108 ms of ~550 ms at load ~12; with CRC-32C the same pairs are
// within their noise (+34 ms cold [−86, +155], −12 ms warm, 8 blocks at
// load ~5). Hence SHA-256 only where it stops someone. 4 KiB is the page every
// device reads in (a uffd fault, a FUSE page), so a check never reads
// more than the device was asked for, and a bad block costs the guest
// only the page it lies in. The CRC-32C table is 1/1024 of the memory
// file, the SHA-256 one 1/128.
package integrity

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"sync/atomic"
)

// BlockBytes is the size of a digested block. The last block of a file may
// be shorter.
const BlockBytes = 4096

// Algorithm names a per-block digest in records and on the wire.
type Algorithm string

// The digests a table can hold.
const (
	// CRC32C is CRC-32C over 4 KiB blocks: it catches accidents, not a
	// writer (see the package doc).
	CRC32C Algorithm = "crc32c-4k"
	// SHA256 is SHA-256 over 4 KiB blocks.
	SHA256 Algorithm = "sha256-4k"
)

// Known reports whether this build reads tables of a.
func (a Algorithm) Known() bool { return a == SHA256 || a == CRC32C }

// ResistsForgery reports whether a writer who can change a block cannot
// make other bytes match its digest on purpose.
func (a Algorithm) ResistsForgery() bool { return a == SHA256 }

// digestBytes is the length of one stored digest.
func (a Algorithm) digestBytes() int {
	if a == SHA256 {
		return sha256.Size
	}
	return 4
}

// code is the algorithm's number in the encoding.
func (a Algorithm) code() uint16 {
	if a == SHA256 {
		return algorithmSHA256
	}
	return algorithmCRC
}

// name is how errors name the digest.
func (a Algorithm) name() string {
	if a == SHA256 {
		return "SHA-256"
	}
	return "CRC-32C"
}

// digest writes the digest of b to dst, which is digestBytes long.
func (a Algorithm) digest(dst, b []byte) {
	if a == SHA256 {
		sum := sha256.Sum256(b)
		copy(dst, sum[:])
		return
	}
	binary.LittleEndian.PutUint32(dst, crc32.Checksum(b, castagnoli))
}

// Errors a Table reports. ErrCorrupt is what a reader of bad bytes gets;
// the others describe a table that cannot be used.
var (
	ErrCorrupt     = errors.New("memory block does not match its digest")
	ErrBadTable    = errors.New("malformed digest table")
	ErrSizeChanged = errors.New("digest table is for a file of another size")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Table holds the digest of every block of one file.
type Table struct {
	alg      Algorithm
	fileSize int64
	// sums holds the digests, digestBytes each, block after block.
	sums []byte
}

// Algorithm is the table's digest.
func (t *Table) Algorithm() Algorithm { return t.alg }

// FileSize is the size of the file the table describes.
func (t *Table) FileSize() int64 { return t.fileSize }

// Blocks is the number of blocks.
func (t *Table) Blocks() int { return len(t.sums) / t.alg.digestBytes() }

// Digest is the stored digest of block i (the caller must not change it),
// for a consumer that compares a block's digest with one it computed
// without reading the block again.
func (t *Table) Digest(i int) []byte { return t.sum(i) }

// sum is the stored digest of block i.
func (t *Table) sum(i int) []byte {
	n := t.alg.digestBytes()
	return t.sums[i*n : (i+1)*n]
}

// blockLen is the length of block i.
func (t *Table) blockLen(i int) int {
	return int(min(BlockBytes, t.fileSize-int64(i)*BlockBytes))
}

func blocksFor(size int64) int { return int((size + BlockBytes - 1) / BlockBytes) }

// Encoding: a 24-byte header, then one digest per block (a little-endian
// uint32 for CRC-32C, 32 bytes for SHA-256).
//
//	0  magic "WSBD"
//	4  version (uint16, 1)
//	6  algorithm (uint16, 1 = CRC-32C, 2 = SHA-256)
//	8  block bytes (uint32, 4096)
//	12 reserved (uint32, 0)
//	16 file size (uint64)
const (
	headerBytes     = 24
	magic           = "WSBD"
	version         = 1
	algorithmCRC    = 1
	algorithmSHA256 = 2
)

// EncodedSize is the length of the encoding of a table of alg for a file
// of size bytes; a reader checks it before reading a table file.
func EncodedSize(alg Algorithm, size int64) int64 {
	return headerBytes + int64(alg.digestBytes())*int64(blocksFor(size))
}

// Encode returns the table's stored form.
func (t *Table) Encode() []byte {
	out := make([]byte, headerBytes+len(t.sums))
	copy(out, magic)
	binary.LittleEndian.PutUint16(out[4:], version)
	binary.LittleEndian.PutUint16(out[6:], t.alg.code())
	binary.LittleEndian.PutUint32(out[8:], BlockBytes)
	binary.LittleEndian.PutUint64(out[16:], uint64(t.fileSize))
	copy(out[headerBytes:], t.sums)
	return out
}

// AlgorithmOf reads the algorithm from an encoded table's header; ok is
// false when there is no header this build reads.
func AlgorithmOf(data []byte) (Algorithm, bool) {
	if len(data) < headerBytes || string(data[:4]) != magic || binary.LittleEndian.Uint16(data[4:]) != version {
		return "", false
	}
	switch binary.LittleEndian.Uint16(data[6:]) {
	case algorithmCRC:
		return CRC32C, true
	case algorithmSHA256:
		return SHA256, true
	}
	return "", false
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
	alg, ok := AlgorithmOf(data)
	if !ok {
		return nil, fmt.Errorf("%w: unknown algorithm %d", ErrBadTable, binary.LittleEndian.Uint16(data[6:]))
	}
	if bs := binary.LittleEndian.Uint32(data[8:]); bs != BlockBytes {
		return nil, fmt.Errorf("%w: block size %d (this build uses %d)", ErrBadTable, bs, BlockBytes)
	}
	size := binary.LittleEndian.Uint64(data[16:])
	if size > 1<<50 || int64(size) != fileSize {
		return nil, fmt.Errorf("%w: table is for %d bytes, file has %d", ErrSizeChanged, size, fileSize)
	}
	if want := EncodedSize(alg, fileSize); int64(len(data)) != want {
		return nil, fmt.Errorf("%w: %d bytes, want %d for a %d-byte file", ErrBadTable, len(data), want, fileSize)
	}
	return &Table{alg: alg, fileSize: fileSize, sums: append([]byte(nil), data[headerBytes:]...)}, nil
}

// BlockError names one block whose bytes do not match the table. It
// matches ErrCorrupt with errors.Is.
type BlockError struct {
	// Offset is the block's offset in the file.
	Offset int64
	// Algorithm is the table's digest; Want is the table's digest of the
	// block, Got the digest of the bytes read, both in hex.
	Algorithm Algorithm
	Want, Got string
}

func (e *BlockError) Error() string {
	return fmt.Sprintf("block at offset %d (%d bytes): %s %s, table says %s: %v",
		e.Offset, BlockBytes, e.Algorithm.name(), e.Got, e.Want, ErrCorrupt)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *BlockError) Is(target error) bool { return target == ErrCorrupt }

// check verifies data, which holds the file's bytes from off, a block
// boundary. Only whole blocks (or the file's short last block) are checked;
// it returns how many leading bytes of data lie in blocks that passed, and
// the first bad block, if any.
//
// skip, when not nil, marks blocks (skip[k] for the k-th block of data)
// that are not hashed: a Prechecker checked them already.
func (t *Table) check(data []byte, off int64, skip []bool) (int, *BlockError) {
	var buf [sha256.Size]byte
	got := buf[:t.alg.digestBytes()]
	done, hashed := 0, 0
	defer func() { t.alg.count(hashed) }()
	for k, i := 0, int(off/BlockBytes); i < t.Blocks(); k, i = k+1, i+1 {
		n := t.blockLen(i)
		if done+n > len(data) {
			break
		}
		if k < len(skip) && skip[k] {
			done += n
			continue
		}
		t.alg.digest(got, data[done:done+n])
		hashed += n
		if want := t.sum(i); !bytes.Equal(got, want) {
			return done, &BlockError{Offset: int64(i) * BlockBytes, Algorithm: t.alg,
				Want: hex.EncodeToString(want), Got: hex.EncodeToString(got)}
		}
		done += n
	}
	return done, nil
}

// sha256Hashed counts the bytes this process hashed to check them against
// SHA-256 tables (SHA256Hashed).
var sha256Hashed atomic.Int64

// count notes n bytes checked against a table of a.
func (a Algorithm) count(n int) {
	if a == SHA256 && n > 0 {
		sha256Hashed.Add(int64(n))
	}
}

// SHA256Hashed is how many bytes this process has hashed so far to check
// them against tables of SHA-256 digests (a device's checks and Verify):
// what tests and benchmarks read to see what verification cost, and that
// no byte is hashed twice on its way to a guest.
func SHA256Hashed() int64 { return sha256Hashed.Load() }

// Equal reports whether t and o hold the same digests of the same file.
func (t *Table) Equal(o *Table) bool {
	return t == o || (o != nil && t.alg == o.alg && t.fileSize == o.fileSize && bytes.Equal(t.sums, o.sums))
}

// Verify checks data, the file's bytes from off, a block boundary, to
// their end: it is nil when every block in it matches its digest, else
// the first bad block's *BlockError. data must end at a block boundary or
// at the end of the file.
func (t *Table) Verify(data []byte, off int64) error {
	end := off + int64(len(data))
	if off < 0 || off%BlockBytes != 0 || end > t.fileSize || (end%BlockBytes != 0 && end != t.fileSize) {
		return fmt.Errorf("integrity: [%d, %d) is not whole blocks of a %d-byte file", off, end, t.fileSize)
	}
	if _, bad := t.check(data, off, nil); bad != nil {
		return bad
	}
	return nil
}

// Mismatches compares t with the table of another reading of the same file
// and returns the offsets of the blocks that differ. A read of another
// algorithm differs in every block: build it with t's (Builder).
func (t *Table) Mismatches(read *Table) []int64 {
	var bad []int64
	for i := range t.Blocks() {
		if read.alg != t.alg || i >= read.Blocks() || !bytes.Equal(read.sum(i), t.sum(i)) {
			bad = append(bad, int64(i)*BlockBytes)
		}
	}
	return bad
}
