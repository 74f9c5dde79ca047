package s3

import (
	"fmt"
	"sync/atomic"

	"warmstart/internal/chunkcache"
	"warmstart/internal/layers"
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
)

// chainRemote is what a restore of a chain with a startup pack asks of
// its memory beyond the layers' bytes (repository.ChainSource.Remote), as
// memorySource answers it for a plain snapshot: the pack streamed into
// the node cache first thing (every layer reads the pages it owns from
// that one object), prefetch kept to what the pack or the node cache
// holds, why the pack was skipped, when the restore is ready.
type chainRemote struct {
	r     *Repo
	pack  *packSource // by memory offset
	chain *layers.Chain
	// layers are the chain's layers served through the node cache,
	// index-aligned with the chain (nil: a layer without data).
	layers []*memorySource
	stream atomic.Pointer[chunkcache.Warming]
}

// newChainRemote has every layer of cs read the pages it owns that ps
// holds from ps, and answers for cs's restores.
func newChainRemote(r *Repo, cs *repository.ChainSource, ps *packSource) *chainRemote {
	attachChainPack(cs, ps)
	c := &chainRemote{r: r, pack: ps, chain: cs.Chain(), layers: make([]*memorySource, len(cs.Layers()))}
	for i, l := range cs.Layers() {
		c.layers[i], _ = l.Data.(*memorySource)
	}
	return c
}

// StreamStartup implements restore.CacheWarmer: the chain's pack,
// streamed whole, front to back, as a plain snapshot's (PackWarmOptions).
func (c *chainRemote) StreamStartup() (repository.CacheWarm, error) {
	whole := []chunkcache.Range{{Offset: 0, Length: c.pack.obj.Size}}
	w, err := c.r.cache.Warm(c.pack.obj, whole, PackWarmOptions(c.r.warm))
	if err != nil {
		return nil, err
	}
	c.r.fill.streaming(w)
	c.stream.Store(w)
	return w, nil
}

// WarmCache implements restore.CacheWarmer: the pack.
func (c *chainRemote) WarmCache([]manifest.Range) (repository.CacheWarm, error) {
	return c.StreamStartup()
}

// PrefetchRanges implements restore.PrefetchTrimmer: the parts of ranges
// the pack holds, the chain defines as zero, or whose owning layer's
// block the node cache holds; a page elsewhere would cost a whole chunk
// before ready, so it is left to demand faults.
//
// Each range is cut where its owner changes, and its pieces are planned
// so that no two neighbours in memory follow each other (interleaved,
// see interleave): the prefetch coalesces a plan's neighbouring ranges
// into one read, and the chain reads a layer's pieces of one read with
// one read of the layer's data when they are dense in it, pages between
// them included. Those pages are the layer's copies of pages an upper
// layer defines (a child's written pages hide its base's): no restore
// needs them, the pack does not hold them, and reading them would fetch
// their whole chunk.
func (c *chainRemote) PrefetchRanges(ranges []manifest.Range) []manifest.Range {
	var out []manifest.Range
	for _, rg := range ranges {
		var pieces []manifest.Range
		c.chain.Pieces(rg.Offset, rg.Length, func(p layers.Piece) bool {
			pieces = append(pieces, c.keptOf(p)...)
			return true
		})
		out = append(out, interleave(pieces)...)
	}
	return out
}

// keptOf is what of the chain's piece p prefetch reads: the whole of a
// zero piece, else its parts the pack holds or the node cache has, each
// run of them one range.
func (c *chainRemote) keptOf(p layers.Piece) []manifest.Range {
	if p.Zero {
		return []manifest.Range{{Offset: p.Off, Length: p.Len}}
	}
	var kept []manifest.Range
	for _, pc := range cutBySpans(c.pack.spans, p.Off, p.Off+p.Len) {
		part := layers.Piece{Off: pc.memOff, Len: pc.length, Layer: p.Layer, LayerOff: p.LayerOff + pc.memOff - p.Off}
		if !pc.fromPack && !c.cached(part) {
			continue
		}
		if n := len(kept); n > 0 && kept[n-1].End() == pc.memOff {
			kept[n-1].Length += pc.length
			continue
		}
		kept = append(kept, manifest.Range{Offset: pc.memOff, Length: pc.length})
	}
	return kept
}

// interleave orders the pieces of one range (ascending, disjoint) every
// other one first, then the rest: no two that meet in memory are planned
// one after the other, so a read covers one piece (two at a range's end,
// meeting the next range's first: then of different layers, or of one
// layer and contiguous in its data).
func interleave(pieces []manifest.Range) []manifest.Range {
	out := make([]manifest.Range, 0, len(pieces))
	for _, start := range []int{0, 1} {
		for i := start; i < len(pieces); i += 2 {
			out = append(out, pieces[i])
		}
	}
	return out
}

// cached reports whether the node cache holds every block of the layer
// data behind p (a layer without remote data needs none).
func (c *chainRemote) cached(p layers.Piece) bool {
	m := c.layers[p.Layer]
	if m == nil {
		return true
	}
	block := c.r.cache.BlockBytes()
	for idx := p.LayerOff / block; idx <= (p.LayerOff+p.Len-1)/block; idx++ {
		if !c.r.cache.Cached(m.obj.ID, idx) {
			return false
		}
	}
	return true
}

// StartupPackSkipped implements restore.PackSkipper: the first layer's
// read of the pack that fell back to its chunks, or the stream's failure.
func (c *chainRemote) StartupPackSkipped() error {
	for _, m := range c.layers {
		if m != nil {
			if err := m.packSkipped.get(); err != nil {
				return err
			}
		}
	}
	if w := c.stream.Load(); w != nil && w.Err() != nil {
		return fmt.Errorf("startup pack stream: %w", w.Err())
	}
	return nil
}

// RestoreReady implements restore.ReadyNotifier: the streamed blocks may
// go to disk, and the rest of every layer into the node cache.
func (c *chainRemote) RestoreReady() {
	if w := c.stream.Load(); w != nil {
		w.ReleaseWrites()
	}
	for _, m := range c.layers {
		if m != nil {
			c.r.fill.start(m.obj)
		}
	}
}

// Unanswered implements restore.StallReporter.
func (c *chainRemote) Unanswered() error { return c.r.counter.stall.unanswered() }
