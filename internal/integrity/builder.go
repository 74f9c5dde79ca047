package integrity

import "fmt"

// Builder computes a table from a file's bytes written to it in order, so
// that a pass that already reads every byte (hashing at publish) builds the
// table on the way.
type Builder struct {
	alg     Algorithm
	sums    []byte
	partial []byte
	written int64
}

// NewBuilder returns a Builder of alg's digests for a file of about
// sizeHint bytes.
func NewBuilder(alg Algorithm, sizeHint int64) *Builder {
	return &Builder{alg: alg, sums: make([]byte, 0, alg.digestBytes()*blocksFor(max(sizeHint, 0))),
		partial: make([]byte, 0, BlockBytes)}
}

// Write digests p; it never fails.
func (b *Builder) Write(p []byte) (int, error) {
	n := len(p)
	b.written += int64(n)
	if len(b.partial) > 0 {
		k := min(BlockBytes-len(b.partial), len(p))
		b.partial = append(b.partial, p[:k]...)
		p = p[k:]
		if len(b.partial) < BlockBytes {
			return n, nil
		}
		b.add(b.partial)
		b.partial = b.partial[:0]
	}
	for len(p) >= BlockBytes {
		b.add(p[:BlockBytes])
		p = p[BlockBytes:]
	}
	b.partial = append(b.partial, p...)
	return n, nil
}

// AppendDigest adds a whole block whose digest d (of the builder's
// algorithm) is already known, so a pass that hashed the block for
// another purpose, or copies it from a table that pins it, does not hash
// it again. It fails if d has the wrong length or a partial block is
// pending (the block would not start on a block boundary).
func (b *Builder) AppendDigest(d []byte) error {
	if len(d) != b.alg.digestBytes() || len(b.partial) != 0 {
		return fmt.Errorf("append a %d-byte %s digest after %d pending bytes: %w", len(d), b.alg, len(b.partial), ErrBadTable)
	}
	b.sums = append(b.sums, d...)
	b.written += BlockBytes
	return nil
}

// add appends the digest of one block.
func (b *Builder) add(block []byte) {
	n := len(b.sums)
	b.sums = append(b.sums, make([]byte, b.alg.digestBytes())...)
	b.alg.digest(b.sums[n:], block)
}

// Table returns the table of everything written so far.
func (b *Builder) Table() *Table {
	t := &Table{alg: b.alg, fileSize: b.written, sums: append([]byte(nil), b.sums...)}
	if len(b.partial) > 0 {
		n := len(t.sums)
		t.sums = append(t.sums, make([]byte, b.alg.digestBytes())...)
		b.alg.digest(t.sums[n:], b.partial)
	}
	return t
}

// Tables builds the two tables a publish stores, CRC-32C and SHA-256, from
// one pass over the file.
type Tables struct {
	CRC, SHA256 *Builder
}

// NewTables returns Tables for a file of about sizeHint bytes.
func NewTables(sizeHint int64) Tables {
	return Tables{CRC: NewBuilder(CRC32C, sizeHint), SHA256: NewBuilder(SHA256, sizeHint)}
}

// Write digests p into both; it never fails.
func (t Tables) Write(p []byte) (int, error) {
	t.CRC.Write(p)
	return t.SHA256.Write(p)
}
