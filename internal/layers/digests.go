package layers

import (
	"fmt"

	"warmstart/internal/integrity"
)

// ChainDigests answers ParentDigests from a chain and the SHA-256 table of
// each of its layers (index-aligned with the chain's layers, bottom
// first): a page's digest is its owner's table entry at the page's slot,
// or the digest of a zero page.
func ChainDigests(c *Chain, tables []*integrity.Table) (ParentDigests, error) {
	if len(tables) != c.Depth()+1 {
		return nil, fmt.Errorf("chain digests: %d tables for %d layers", len(tables), c.Depth()+1)
	}
	for i, t := range tables {
		if t == nil || t.Algorithm() != integrity.SHA256 {
			return nil, fmt.Errorf("chain digests: layer %d has no SHA-256 table", i)
		}
	}
	if tables[0].FileSize() != c.Size() {
		return nil, fmt.Errorf("chain digests: base table describes %d bytes, the memory has %d", tables[0].FileSize(), c.Size())
	}
	return chainDigests{c: c, tables: tables}, nil
}

type chainDigests struct {
	c      *Chain
	tables []*integrity.Table
}

func (d chainDigests) PageSHA256(page int64) (sum [32]byte, ok bool) {
	if page < 0 || page >= d.c.pages {
		return sum, false
	}
	layer, slot, zero := d.c.Locate(page)
	if zero {
		return zeroPageSHA256, true
	}
	t := d.tables[layer]
	if slot >= int64(t.Blocks()) {
		return sum, false
	}
	copy(sum[:], t.Digest(int(slot)))
	return sum, true
}
