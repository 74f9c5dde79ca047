package integrity

// Builder computes a table from a file's bytes written to it in order, so
// that a pass that already reads every byte (hashing at publish) builds the
// table on the way.
type Builder struct {
	sums    []uint32
	partial []byte
	written int64
}

// NewBuilder returns a Builder for a file of about sizeHint bytes.
func NewBuilder(sizeHint int64) *Builder {
	return &Builder{sums: make([]uint32, 0, blocksFor(max(sizeHint, 0))), partial: make([]byte, 0, BlockBytes)}
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
		b.sums = append(b.sums, checksum(b.partial))
		b.partial = b.partial[:0]
	}
	for len(p) >= BlockBytes {
		b.sums = append(b.sums, checksum(p[:BlockBytes]))
		p = p[BlockBytes:]
	}
	b.partial = append(b.partial, p...)
	return n, nil
}

// Table returns the table of everything written so far.
func (b *Builder) Table() *Table {
	sums := append([]uint32(nil), b.sums...)
	if len(b.partial) > 0 {
		sums = append(sums, checksum(b.partial))
	}
	return &Table{fileSize: b.written, sums: sums}
}
