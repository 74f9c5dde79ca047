package layers

import (
	"fmt"
	"io"

	"warmstart/internal/integrity"
)

// Source is one existing diff layer as Merge reads it: its page map, its
// data, and its SHA-256 table, whose digests the merged layer's table
// copies, so no page is hashed again with SHA-256. Data must serve
// checked bytes (an integrity.Reader over that table, or a memory
// device's verified reader): Merge does not check them again.
type Source struct {
	Map    *PageMap
	Data   io.ReaderAt
	SHA256 *integrity.Table
}

// Merge writes to dir one diff layer holding every page that srcs (diff
// layers of one memory of memorySize bytes, bottom first) define, each in
// its topmost version: what a chain of these layers over a base serves
// equals what the merged layer over the same base serves.
func Merge(dir string, memorySize int64, srcs []Source) (*Built, error) {
	maps := make([]*PageMap, len(srcs)+1)
	for i, s := range srcs {
		if s.Map == nil || s.Data == nil || s.SHA256 == nil || s.SHA256.Algorithm() != integrity.SHA256 ||
			s.SHA256.FileSize() != s.Map.DataBytes() {
			return nil, fmt.Errorf("merge: layer %d lacks its map, data or a SHA-256 table of its data", i+1)
		}
		maps[i+1] = s.Map
	}
	c, err := NewChain(memorySize, maps)
	if err != nil {
		return nil, fmt.Errorf("merge: %w", err)
	}
	w, err := newLayerWriter(dir, memorySize)
	if err != nil {
		return nil, err
	}
	if err := mergePages(w, c, srcs); err != nil {
		w.abort()
		return nil, err
	}
	return w.finish()
}

// mergePages copies every page the diff layers define into w.
func mergePages(w *layerWriter, c *Chain, srcs []Source) error {
	page := make([]byte, PageBytes)
	for p := range c.pages {
		layer, slot, zero := c.Locate(p)
		switch {
		case layer == 0:
			continue
		case zero:
			w.counts.Candidates++
			w.zero(p)
			continue
		}
		w.counts.Candidates++
		s := srcs[layer-1]
		if _, err := s.Data.ReadAt(page, slot*PageBytes); err != nil {
			return fmt.Errorf("merge: read page %d of layer %d (slot %d): %w", p, layer, slot, err)
		}
		if err := w.store(p, page, s.SHA256.Digest(int(slot))); err != nil {
			return err
		}
	}
	return nil
}
