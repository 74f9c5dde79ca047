package s3

import (
	"context"
	"fmt"
	"sort"

	"warmstart/internal/chunkmap"
	"warmstart/internal/layers"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
)

// A chain's startup pack. A paused child's startup set lies mostly in
// its ancestors' layers (the pages its restore read on the way to ready),
// scattered over their chunks, so reading it from the layers costs a whole
// chunk per page: a cold node fetched 2.2x the set before ready. The
// child's pack therefore holds the set's pages whatever layer owns them,
// in first-touch order, with a self-describing (format 2) index naming
// the memory ranges it holds. A restore maps those memory ranges through
// the chain onto each layer's data (attachChainPack): every layer reads
// the pages it owns from the one pack object where the pack holds them,
// and the device checks them, as any read of that layer, against the
// owning layer's digest table. Zero pages a layer defines read nothing.

// buildChainPack reads the pages of the manifest data from the layered
// record rec's chain and stores them as rec's startup pack. The pages
// come through via's streamed pack where it holds them (the parent's,
// when a pause publishes: the node that paused restored it, so they are
// in its cache), and from own's local data for the pages of the layer
// being published (nil at an attach, when the store has every layer).
func (r *Repo) buildChainPack(ctx context.Context, rec, via repository.Record, own *layers.Built, data []byte) (*repository.StartupPackDescriptor, error) {
	m, err := manifest.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("startup pack: %w", err)
	}
	src, err := r.packReadSource(ctx, rec, r.currentPack(ctx, via), own)
	if err != nil {
		return nil, fmt.Errorf("startup pack: %w", err)
	}
	logical, err := readPackContents(src, m)
	if err != nil {
		return nil, fmt.Errorf("startup pack: %w", err)
	}
	msum := chunkmap.Sum(data)
	obj, idx := chunkmap.BuildPack(msum, logical, chunkmap.DefaultFrameBytes, packRanges(m)...)
	objKey, indexKey := packKeys(r.keys, rec.ID, msum.String())
	return r.storePack(ctx, objKey, indexKey, obj, idx)
}

// packReadSource is rec's memory as a pack build reads it: with the pages
// the pack via holds (nil: none) taken from it, and for a layered record
// the layer own (nil: none) read from its local data.
func (r *Repo) packReadSource(ctx context.Context, rec repository.Record, via *packSource, own *layers.Built) (memdev.Source, error) {
	if !rec.Layered() {
		src, err := r.memoryOf(ctx, rec)
		if err != nil {
			return nil, err
		}
		src.pack = via
		return src, nil
	}
	ls, err := r.resolvedLayers(ctx, rec, own)
	if err != nil {
		return nil, err
	}
	cs, err := repository.NewChainSource(rec, ls)
	if err != nil {
		return nil, err
	}
	if via != nil {
		attachChainPack(cs, via)
	}
	return cs, nil
}

// ownLayer is the layer own as a pack build reads it: its page map and
// its local data, not yet in the store.
func ownLayer(d repository.LayerDescriptor, own *layers.Built) repository.ResolvedLayer {
	l := repository.ResolvedLayer{Descriptor: d, PageMap: own.Map, Data: repository.EmptyLayerData()}
	if own.Size > 0 {
		l.Data = repository.LocalLayerData(own.Path(layers.DataFileName))
	}
	return l
}

// attachChainPack has every layer of cs served through the store read
// the pages it owns that the pack ps holds (by memory offset) from ps.
func attachChainPack(cs *repository.ChainSource, ps *packSource) {
	spans := layerSpans(cs.Chain(), ps.spans)
	for i, l := range cs.Layers() {
		if m, ok := l.Data.(*memorySource); ok && len(spans[i]) > 0 {
			m.pack = &packSource{obj: ps.obj, spans: spans[i]}
		}
	}
}

// layerSpans maps pack spans by memory offset onto each layer of c: per
// layer, spans by offset in that layer's data, sorted, neighbours that
// continue each other in both the layer and the pack coalesced. Pages a
// layer defines as zero are in none.
func layerSpans(c *layers.Chain, spans []packSpan) [][]packSpan {
	out := make([][]packSpan, c.Depth()+1)
	for _, s := range spans {
		c.Pieces(s.memOff, s.length, func(p layers.Piece) bool {
			if p.Zero {
				return true
			}
			packOff := s.packOff + p.Off - s.memOff
			l := out[p.Layer]
			if n := len(l); n > 0 && l[n-1].end() == p.LayerOff && l[n-1].packOff+l[n-1].length == packOff {
				l[n-1].length += p.Len
				return true
			}
			out[p.Layer] = append(l, packSpan{memOff: p.LayerOff, length: p.Len, packOff: packOff})
			return true
		})
	}
	for _, l := range out {
		sort.Slice(l, func(i, j int) bool { return l[i].memOff < l[j].memOff })
	}
	return out
}
