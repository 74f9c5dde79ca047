package layers

import (
	"fmt"
	"math/bits"
)

// MaxLayers is the most layers a chain holds (a base and 127 diff layers):
// a page's owner is one byte, its top bit marking a zero page.
const MaxLayers = 128

// zeroBit marks an owner entry whose page the owning layer defines as zero.
const zeroBit = 0x80

// Chain resolves every page of a memory to the topmost layer that defines
// it. Layer 0 is the full base: it defines every page (slot = page); each
// diff layer defines the pages of its page map.
type Chain struct {
	pages int64
	// owner holds, per page, the index of the layer that serves it, with
	// zeroBit set when that layer defines it as zero.
	owner []uint8
	// rank holds, per layer (nil for the base), which pages the layer
	// stores, for the slot of a page within the layer's data.
	rank []*rankIndex
}

// NewChain builds the chain of a memory of memorySize bytes from its
// layers' page maps, bottom first: maps[0] is nil (the full base), every
// other a diff layer's map of a memory of memorySize bytes.
func NewChain(memorySize int64, maps []*PageMap) (*Chain, error) {
	switch {
	case len(maps) == 0 || len(maps) > MaxLayers:
		return nil, fmt.Errorf("chain of %d layers: want 1..%d", len(maps), MaxLayers)
	case maps[0] != nil:
		return nil, fmt.Errorf("chain layer 0 has a page map: the base is a full memory")
	case memorySize <= 0 || memorySize%PageBytes != 0 || memorySize > maxMemorySize:
		return nil, fmt.Errorf("chain of a %d-byte memory: want a positive multiple of %d", memorySize, PageBytes)
	}
	c := &Chain{pages: memorySize / PageBytes, rank: make([]*rankIndex, len(maps))}
	c.owner = make([]uint8, c.pages)
	for i := 1; i < len(maps); i++ {
		m := maps[i]
		if m == nil || m.MemorySize != memorySize {
			return nil, fmt.Errorf("chain layer %d: page map missing or of another memory size", i)
		}
		if err := m.Validate(); err != nil {
			return nil, fmt.Errorf("chain layer %d: %w", i, err)
		}
		c.rank[i] = newRankIndex(c.pages, m.Data)
		c.own(uint8(i), m.Data, 0)
		c.own(uint8(i), m.Zero, zeroBit)
	}
	return c, nil
}

// own gives layer the pages of runs; layers are applied bottom first, so
// the topmost definition of a page is the last one written.
func (c *Chain) own(layer uint8, runs []Run, flag uint8) {
	for _, r := range runs {
		o := c.owner[r.First:r.End()]
		for i := range o {
			o[i] = layer | flag
		}
	}
}

// Pages is the number of pages of the memory.
func (c *Chain) Pages() int64 { return c.pages }

// Size is the memory's size in bytes.
func (c *Chain) Size() int64 { return c.pages * PageBytes }

// Depth is the number of diff layers.
func (c *Chain) Depth() int { return len(c.rank) - 1 }

// Locate says which layer serves page, and the page's slot in that
// layer's data (the page itself for the base). zero reports a page the
// layer defines as zero (slot is then meaningless). page must be in
// [0, Pages()).
func (c *Chain) Locate(page int64) (layer int, slot int64, zero bool) {
	o := c.owner[page]
	layer = int(o &^ zeroBit)
	if o&zeroBit != 0 {
		return layer, 0, true
	}
	if layer == 0 {
		return 0, page, false
	}
	return layer, c.rank[layer].rank(page), false
}

// Piece is a contiguous part of a read served by one layer: Len bytes at
// logical offset Off, read from LayerOff in layer Layer's data, or all
// zero.
type Piece struct {
	Off, Len int64
	Layer    int
	LayerOff int64
	Zero     bool
}

// Pieces splits the logical range [off, off+length), clipped to the
// memory, into pieces in ascending order, coalescing neighbouring pages
// that one layer stores contiguously (or defines as zero). It stops when
// yield returns false.
func (c *Chain) Pieces(off, length int64, yield func(Piece) bool) {
	end := min(off+length, c.Size())
	if off < 0 || off >= end {
		return
	}
	var cur Piece
	have := false
	for at := off; at < end; {
		page := at / PageBytes
		n := min(end, (page+1)*PageBytes) - at
		layer, slot, zero := c.Locate(page)
		p := Piece{Off: at, Len: n, Layer: layer, LayerOff: slot*PageBytes + at%PageBytes, Zero: zero}
		if zero {
			p.LayerOff = 0
		}
		if have && cur.extends(p) {
			cur.Len += n
		} else {
			if have && !yield(cur) {
				return
			}
			cur, have = p, true
		}
		at += n
	}
	if have {
		yield(cur)
	}
}

// extends reports whether p continues c in the same layer.
func (c Piece) extends(p Piece) bool {
	if c.Layer != p.Layer || c.Zero != p.Zero || c.Off+c.Len != p.Off {
		return false
	}
	return c.Zero || c.LayerOff+c.Len == p.LayerOff
}

// rankIndex answers how many of a layer's data pages come before a page:
// a bitmap of its data pages and the count before every block of
// rankBlock pages.
type rankIndex struct {
	bits   []uint64
	before []uint32
}

const (
	rankBlock = 512
	rankWords = rankBlock / 64
)

func newRankIndex(pages int64, data []Run) *rankIndex {
	words := (pages + 63) / 64
	x := &rankIndex{bits: make([]uint64, words), before: make([]uint32, (words+rankWords-1)/rankWords)}
	for _, r := range data {
		for p := r.First; p < r.End(); p++ {
			x.bits[p/64] |= 1 << (p % 64)
		}
	}
	var n uint32
	for i := range x.before {
		x.before[i] = n
		for _, w := range x.bits[i*rankWords : min(len(x.bits), (i+1)*rankWords)] {
			n += uint32(bits.OnesCount64(w))
		}
	}
	return x
}

// rank is the number of data pages before page.
func (x *rankIndex) rank(page int64) int64 {
	block := page / rankBlock
	n := int64(x.before[block])
	w := page / 64
	for i := block * rankWords; i < w; i++ {
		n += int64(bits.OnesCount64(x.bits[i]))
	}
	return n + int64(bits.OnesCount64(x.bits[w]&(1<<(page%64)-1)))
}
