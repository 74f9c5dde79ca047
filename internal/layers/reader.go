package layers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
)

// contextReaderAt and advisor are the optional method sets of a layer's
// reader (memdev.ContextReaderAt and memdev.Advisor, declared here so this
// base package imports no device package).
type contextReaderAt interface {
	ReadAtContext(ctx context.Context, p []byte, off int64) (int, error)
}

type advisor interface {
	Advise(off, length int64) error
}

// maxParallelLayers bounds the layers one read fetches at once.
const maxParallelLayers = 4

// maxGather bounds the span a single gathering read of one layer covers;
// sparser or longer spans are read piece by piece.
const maxGather = 8 << 20

// LayerError is a failed read of one layer: Layer is its index in the
// chain, Logical the memory offset the read served. It wraps the layer's
// error, so errors.Is sees through it (integrity.ErrCorrupt stays
// visible).
type LayerError struct {
	Layer   int
	Logical int64
	Err     error
}

func (e *LayerError) Error() string {
	return fmt.Sprintf("memory layer %d (serving offset %d): %v", e.Layer, e.Logical, e.Err)
}

func (e *LayerError) Unwrap() error { return e.Err }

// Reader reads a chain of layers as one memory: each read is split by the
// chain, zero pages cleared, and each layer it touches read at most once
// (one read over the layer's span when the pieces are dense in it).
type Reader struct {
	c      *Chain
	layers []io.ReaderAt
	// parallel: at least two layers can wait on storage (their reads
	// take a context), so their reads of one call run concurrently.
	parallel bool
	bufs     sync.Pool
}

// NewReader reads the memory c describes from layers, index-aligned with
// the chain's layers (layers[0] the full base, a diff layer's reader its
// data). Close closes every layer that is an io.Closer.
func NewReader(c *Chain, layers []io.ReaderAt) (*Reader, error) {
	if len(layers) != c.Depth()+1 {
		return nil, fmt.Errorf("chain reader: %d layer readers for %d layers", len(layers), c.Depth()+1)
	}
	slow := 0
	for _, l := range layers {
		if _, ok := l.(contextReaderAt); ok {
			slow++
		}
	}
	return &Reader{c: c, layers: layers, parallel: slow >= 2}, nil
}

// Chain is the chain the reader resolves pages with.
func (r *Reader) Chain() *Chain { return r.c }

// Size is the memory's size.
func (r *Reader) Size() int64 { return r.c.Size() }

// Close closes every layer that is an io.Closer.
func (r *Reader) Close() error {
	var errs []error
	for _, l := range r.layers {
		if c, ok := l.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// ReadAt implements io.ReaderAt.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	return r.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext reads as ReadAt, passing ctx to layers whose reads take
// one, so a read waiting on storage ends when ctx does.
func (r *Reader) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("chain reader: negative offset %d", off)
	}
	if off >= r.Size() {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), r.Size()-off))
	groups := r.split(p[:n], off)
	if err := r.readGroups(ctx, groups); err != nil {
		return 0, err
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// group is the pieces of one read that one layer serves, in order.
type group struct {
	layer  int
	dst    []byte
	base   int64 // the logical offset of dst[0]
	pieces []Piece
}

// split clears the zero pieces of dst (the memory from off) and groups
// the rest by layer.
func (r *Reader) split(dst []byte, off int64) []*group {
	var groups []*group
	byLayer := map[int]*group{}
	r.c.Pieces(off, int64(len(dst)), func(pc Piece) bool {
		if pc.Zero {
			clear(dst[pc.Off-off : pc.Off-off+pc.Len])
			return true
		}
		g := byLayer[pc.Layer]
		if g == nil {
			g = &group{layer: pc.Layer, dst: dst, base: off}
			byLayer[pc.Layer] = g
			groups = append(groups, g)
		}
		g.pieces = append(g.pieces, pc)
		return true
	})
	return groups
}

// readGroups reads every group, concurrently when the layers wait on
// storage.
func (r *Reader) readGroups(ctx context.Context, groups []*group) error {
	if !r.parallel || len(groups) < 2 {
		for _, g := range groups {
			if err := r.readGroup(ctx, g); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make([]error, len(groups))
	sem := make(chan struct{}, maxParallelLayers)
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = r.readGroup(ctx, g)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// readGroup reads one layer's pieces: one read over their span when they
// are dense in it, else one read per piece.
func (r *Reader) readGroup(ctx context.Context, g *group) error {
	first, last := g.pieces[0], g.pieces[len(g.pieces)-1]
	span := last.LayerOff + last.Len - first.LayerOff
	var want int64
	for _, pc := range g.pieces {
		want += pc.Len
	}
	if len(g.pieces) > 1 && 2*want >= span && span <= maxGather {
		return r.gather(ctx, g, first.LayerOff, span)
	}
	for _, pc := range g.pieces {
		if err := r.readLayer(ctx, g.layer, g.dst[pc.Off-g.base:pc.Off-g.base+pc.Len], pc.LayerOff, pc.Off); err != nil {
			return err
		}
	}
	return nil
}

// gather reads span bytes of the layer from its offset at once and copies
// each piece out.
func (r *Reader) gather(ctx context.Context, g *group, at, span int64) error {
	bp, _ := r.bufs.Get().(*[]byte)
	if bp == nil || int64(cap(*bp)) < span {
		b := make([]byte, span)
		bp = &b
	}
	defer r.bufs.Put(bp)
	buf := (*bp)[:span]
	if err := r.readLayer(ctx, g.layer, buf, at, g.pieces[0].Off); err != nil {
		return err
	}
	for _, pc := range g.pieces {
		copy(g.dst[pc.Off-g.base:pc.Off-g.base+pc.Len], buf[pc.LayerOff-at:])
	}
	return nil
}

// readLayer fills dst from the layer at off; logical names the memory
// offset it serves, for the error.
func (r *Reader) readLayer(ctx context.Context, layer int, dst []byte, off, logical int64) error {
	var n int
	var err error
	if cr, ok := r.layers[layer].(contextReaderAt); ok {
		n, err = cr.ReadAtContext(ctx, dst, off)
	} else {
		n, err = r.layers[layer].ReadAt(dst, off)
	}
	if n == len(dst) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = fmt.Errorf("short read: %d of %d bytes at %d: %w", n, len(dst), off, io.ErrUnexpectedEOF)
	}
	return &LayerError{Layer: layer, Logical: logical, Err: err}
}

// Advise tells each layer that can be advised which of its bytes serve
// [off, off+length) (one span per layer).
func (r *Reader) Advise(off, length int64) error {
	spans := map[int][2]int64{}
	r.c.Pieces(off, length, func(pc Piece) bool {
		if pc.Zero {
			return true
		}
		s, ok := spans[pc.Layer]
		if !ok {
			s = [2]int64{pc.LayerOff, pc.LayerOff}
		}
		s[1] = pc.LayerOff + pc.Len
		spans[pc.Layer] = s
		return true
	})
	var errs []error
	for layer, s := range spans {
		if a, ok := r.layers[layer].(advisor); ok {
			errs = append(errs, a.Advise(s[0], s[1]-s[0]))
		}
	}
	return errors.Join(errs...)
}
