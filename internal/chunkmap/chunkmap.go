// Package chunkmap is the stored form of a memory file in an object store:
// a Map from the file's logical chunks to content-addressed, individually
// zstd-compressed chunk objects, and a PackIndex describing a startup pack
// (the startup set's pages in first-touch order, compressed in frames).
//
// Both are pure formats: encoding, decoding with validation, and the codec
// of one chunk or frame, which checks the SHA-256 of the uncompressed bytes
// so a corrupt or truncated object is reported, never returned.
package chunkmap

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// DefaultChunkBytes is the logical size of a chunk. Measured on the 128 MiB
// reference snapshot with zstd (klauspost/compress), 2-core host under load:
// 256 KiB, 512 KiB, 1 MiB and 4 MiB chunks all store 0.562-0.564x of raw at
// every level (the non-zero pages are incompressible, the zero pages cost
// nearly nothing inside a chunk), so the size is chosen for reads: 1 MiB is
// the chunk cache's block, measured best for startup prefetch (cache.go in
// package chunkcache), and one chunk then fills one cache block with one GET.
const DefaultChunkBytes = 1 << 20

// Level is the zstd level of chunks and frames. SpeedDefault (zstd level 3)
// stored as little as SpeedBetterCompression on the reference (0.563x vs
// 0.562x) and encoded 1 MiB chunks ~3x faster; decoding speed is alike.
const Level = zstd.SpeedDefault

// ErrCorrupt reports stored bytes that do not decode to the bytes their
// digest names.
var ErrCorrupt = errors.New("corrupt chunk")

// Digest is the SHA-256 of a chunk's uncompressed bytes: its name.
type Digest [sha256.Size]byte

// String is the lowercase hex form used in object keys.
func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// Sum is the digest of data.
func Sum(data []byte) Digest { return sha256.Sum256(data) }

var (
	encoderOnce sync.Once
	encoder     *zstd.Encoder
	decoder     *zstd.Decoder
)

func codecs() (*zstd.Encoder, *zstd.Decoder) {
	encoderOnce.Do(func() {
		// EncodeAll and DecodeAll are safe for concurrent use; one of each
		// per process keeps their window buffers shared.
		encoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(Level), zstd.WithEncoderConcurrency(2))
		// Lowmem off: the decoders keep their buffers between frames
		// instead of allocating them per frame (a cold node decodes
		// hundreds of frames before ready). The cap limit makes DecodeAll
		// refuse a frame that decodes to more than its destination holds
		// rather than allocate for it: every caller knows the length.
		decoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxMemory(256<<20),
			zstd.WithDecoderLowmem(false), zstd.WithDecodeAllCapLimit(true))
	})
	return encoder, decoder
}

// Compress is data as one zstd frame.
func Compress(data []byte) []byte {
	enc, _ := codecs()
	return enc.EncodeAll(data, make([]byte, 0, len(data)/2))
}

// Decompress decodes stored, which must hold exactly want bytes whose
// SHA-256 is digest; anything else is ErrCorrupt.
func Decompress(stored []byte, want int, digest Digest) ([]byte, error) {
	out := make([]byte, want)
	if err := DecompressInto(out, stored, digest); err != nil {
		return nil, err
	}
	return out, nil
}

// DecompressInto decodes stored into dst, which it must fill exactly with
// bytes whose SHA-256 is digest; anything else is ErrCorrupt. On error
// dst holds undefined bytes, which the caller must not use: the decoder
// writes into dst before the digest can be checked, which saves a copy of
// every byte a cold node streams.
func DecompressInto(dst, stored []byte, digest Digest) error {
	if err := DecodeInto(dst, stored); err != nil {
		return fmt.Errorf("%w (digest %s)", err, digest)
	}
	if Sum(dst) != digest {
		return fmt.Errorf("%w %s: the decoded bytes have another digest", ErrCorrupt, digest)
	}
	return nil
}

// DecodeInto decodes stored into dst, which it must fill exactly;
// anything else is ErrCorrupt. It checks no digest: for a caller that
// checks the decoded bytes against digests of its own (a startup pack's
// frames against the memory's table). On error dst holds undefined bytes.
func DecodeInto(dst, stored []byte) error {
	_, dec := codecs()
	out, err := dec.DecodeAll(stored, dst[:0:len(dst)])
	if err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if len(out) != len(dst) {
		return fmt.Errorf("%w: %d bytes decoded, want %d", ErrCorrupt, len(out), len(dst))
	}
	return nil
}

// IsZero reports whether every byte of data is zero. Such chunks are not
// stored: a reader makes them up without a request.
func IsZero(data []byte) bool {
	var zero [4096]byte
	for len(data) > 0 {
		n := min(len(data), len(zero))
		if !bytes.Equal(data[:n], zero[:n]) {
			return false
		}
		data = data[n:]
	}
	return true
}

// Chunk is one logical chunk of a memory file.
type Chunk struct {
	// Zero marks an all-zero chunk, which has no object.
	Zero bool
	// Digest names the chunk object (unset when Zero).
	Digest Digest
	// StoredBytes is the compressed object's size (0 when Zero).
	StoredBytes int64
}

// Map is how a memory file of Size bytes is stored: chunk i holds bytes
// [i*ChunkBytes, min((i+1)*ChunkBytes, Size)).
type Map struct {
	ChunkBytes int64
	Size       int64
	Chunks     []Chunk
}

// Length is the logical length of chunk i.
func (m Map) Length(i int) int64 {
	return min(m.ChunkBytes, m.Size-int64(i)*m.ChunkBytes)
}

// StoredBytesBeyond is the compressed size of the distinct chunk objects
// m references that base does not: what storing m adds to a bucket that
// holds base already (a second capture of one guest after its first).
func (m Map) StoredBytesBeyond(base Map) int64 {
	held := map[Digest]bool{}
	for _, c := range base.Chunks {
		if !c.Zero {
			held[c.Digest] = true
		}
	}
	var n int64
	for _, c := range m.Chunks {
		if !c.Zero && !held[c.Digest] {
			held[c.Digest] = true
			n += c.StoredBytes
		}
	}
	return n
}

// StoredBytes is the compressed size of the distinct chunk objects the map
// references.
func (m Map) StoredBytes() int64 { return m.StoredBytesBeyond(Map{}) }

const (
	mapMagic       = "WSCHMAP1"
	mapHeaderBytes = 8 + 8 + 8 + 4
	mapEntryBytes  = 1 + sha256.Size + 4
	// MaxChunkBytes bounds a chunk (and a frame), so a decoder never sizes
	// a buffer from a hostile header.
	MaxChunkBytes = 64 << 20
)

// Encode is the map's binary form: magic, chunk size, file size, count,
// then per chunk a kind byte (0 zero, 1 zstd), its digest and stored size.
func (m Map) Encode() []byte {
	out := make([]byte, 0, mapHeaderBytes+len(m.Chunks)*mapEntryBytes)
	out = append(out, mapMagic...)
	out = binary.LittleEndian.AppendUint64(out, uint64(m.ChunkBytes))
	out = binary.LittleEndian.AppendUint64(out, uint64(m.Size))
	out = binary.LittleEndian.AppendUint32(out, uint32(len(m.Chunks)))
	for _, c := range m.Chunks {
		kind := byte(1)
		if c.Zero {
			kind = 0
		}
		out = append(out, kind)
		out = append(out, c.Digest[:]...)
		out = binary.LittleEndian.AppendUint32(out, uint32(c.StoredBytes))
	}
	return out
}

// Decode parses an encoded map of a memory file of size bytes and checks
// every field; an error names the field.
func Decode(data []byte, size int64) (Map, error) {
	if len(data) < mapHeaderBytes || string(data[:8]) != mapMagic {
		return Map{}, errors.New("chunk map: bad magic or truncated header")
	}
	chunkBytes, stored := binary.LittleEndian.Uint64(data[8:]), binary.LittleEndian.Uint64(data[16:])
	count := int64(binary.LittleEndian.Uint32(data[24:]))
	switch {
	case chunkBytes < 4096 || chunkBytes > MaxChunkBytes || chunkBytes%4096 != 0:
		return Map{}, fmt.Errorf("chunk map: chunk_bytes %d is not a multiple of 4096 in 4 KiB..%d", chunkBytes, MaxChunkBytes)
	case size < 0 || stored != uint64(size):
		return Map{}, fmt.Errorf("chunk map: size %d differs from the memory size %d", stored, size)
	}
	m := Map{ChunkBytes: int64(chunkBytes), Size: size}
	switch {
	case count != size/m.ChunkBytes+min(size%m.ChunkBytes, 1):
		return Map{}, fmt.Errorf("chunk map: count %d does not cover %d bytes in %d-byte chunks", count, size, m.ChunkBytes)
	case int64(len(data)) != mapHeaderBytes+count*mapEntryBytes:
		return Map{}, fmt.Errorf("chunk map: %d bytes, want %d for %d chunks", len(data), mapHeaderBytes+count*mapEntryBytes, count)
	}
	m.Chunks = make([]Chunk, count)
	for i := range m.Chunks {
		if err := decodeChunk(&m.Chunks[i], data[mapHeaderBytes+i*mapEntryBytes:]); err != nil {
			return Map{}, fmt.Errorf("chunk map: chunk %d: %w", i, err)
		}
	}
	return m, nil
}

// decodeChunk parses one entry of an encoded map into c.
func decodeChunk(c *Chunk, e []byte) error {
	copy(c.Digest[:], e[1:1+sha256.Size])
	c.StoredBytes = int64(binary.LittleEndian.Uint32(e[1+sha256.Size:]))
	switch e[0] {
	case 0:
		c.Zero = true
		if c.StoredBytes != 0 || c.Digest != (Digest{}) {
			return errors.New("a zero chunk with a digest or stored size")
		}
	case 1:
		if c.StoredBytes <= 0 || c.StoredBytes > MaxChunkBytes*2 {
			return fmt.Errorf("stored_bytes %d out of range", c.StoredBytes)
		}
	default:
		return fmt.Errorf("kind %d unknown", e[0])
	}
	return nil
}

// DecodeAny decodes an encoded map of whatever size its header names (for
// garbage collection, which marks the chunks of maps it has no record of).
func DecodeAny(data []byte) (Map, error) {
	if len(data) < mapHeaderBytes {
		return Map{}, errors.New("chunk map: truncated header")
	}
	size := binary.LittleEndian.Uint64(data[16:])
	if size > math.MaxInt64 {
		return Map{}, fmt.Errorf("chunk map: size %d is beyond the int64 range", size)
	}
	return Decode(data, int64(size))
}
