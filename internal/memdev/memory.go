package memdev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"warmstart/internal/integrity"
	"warmstart/internal/layers"
)

// Verifier checks a lower's blocks against the snapshot's digest table
// before a device serves them.
type Verifier struct {
	Table *integrity.Table
	// OnCorrupt, when not nil, is told once of each bad block met.
	OnCorrupt func(*integrity.BlockError)
}

// Layered is a Source whose memory is a chain of layers (package layers):
// a device opens each layer, checks it with its own Verifier
// (Request.Verifiers) and reads them through the chain, so neither device
// knows layers exist.
type Layered interface {
	Source
	Chain() *layers.Chain
	// OpenLayers opens every layer's data, base first.
	OpenLayers() ([]Lower, error)
}

// Memory is a Request's memory as every device reads it: Source.Open's
// Lower, its reads bound to the device's ReadScope, failed reads told to
// Request.OnReadError, and each block checked by Request.Verifier before it
// is returned. A Memory is a Lower (uffd.Listen takes one). Advise and the
// lower's ModTime reach the opened Lower directly, so no wrapper has to
// forward optional interfaces.
type Memory struct {
	raw      Lower
	chain    io.ReaderAt
	size     int64
	verified bool
	opened   time.Time
}

// OpenMemory opens req.Memory and builds the chain; scope may be nil (the
// reads then never end early). It fails, wrapping integrity.ErrSizeChanged,
// when the lower's size is not the table's. A Layered source's layers are
// each opened and wrapped so, with its own Verifier of req.Verifiers, and
// read through the chain.
func OpenMemory(req Request, scope *ReadScope) (*Memory, error) {
	if req.Memory == nil {
		return nil, errors.New("open memory: no memory source")
	}
	if l, ok := req.Memory.(Layered); ok {
		return openLayered(req, l, scope)
	}
	raw, err := req.Memory.Open()
	if err != nil {
		return nil, err
	}
	chain, verified, err := wrapLower(raw, req.Memory.Ref(), req.Verifier, req.OnReadError, scope)
	if err != nil {
		raw.Close()
		return nil, err
	}
	return &Memory{raw: raw, chain: chain, size: raw.Size(), verified: verified, opened: time.Now()}, nil
}

// wrapLower binds raw's reads to scope, tells onError of failed ones and
// checks every block with v (when not nil).
func wrapLower(raw Lower, ref string, v *Verifier, onError func(error), scope *ReadScope) (io.ReaderAt, bool, error) {
	var chain io.ReaderAt = raw
	if cr, ok := raw.(ContextReaderAt); ok && scope != nil {
		scope.bind()
		chain = boundReader{cr: cr, scope: scope}
	}
	if onError != nil {
		chain = watchedReader{r: chain, onError: onError}
	}
	if v == nil {
		return chain, false, nil
	}
	if v.Table.FileSize() != raw.Size() {
		return nil, false, fmt.Errorf("%w: lower %s has %d bytes, its digest table describes %d",
			integrity.ErrSizeChanged, ref, raw.Size(), v.Table.FileSize())
	}
	src := chain
	if u, ok := raw.(integrity.Uncacher); ok {
		src = uncachingReader{ReaderAt: src, u: u}
	}
	if pc, ok := raw.(ContextPrechecker); ok {
		src = precheckingReader{uncachingReader: uncachingReader{ReaderAt: chain, u: pc}, pc: pc, scope: scope, onError: onError}
	}
	return integrity.NewReader(src, v.Table, v.OnCorrupt), true, nil
}

// openLayered opens every layer of l, each wrapped as a plain memory is,
// and reads them through l's chain. The Memory is verified only if every
// layer is.
func openLayered(req Request, l Layered, scope *ReadScope) (*Memory, error) {
	if len(req.Verifiers) != 0 && len(req.Verifiers) != l.Chain().Depth()+1 {
		return nil, fmt.Errorf("open memory %s: %d verifiers for %d layers", l.Ref(), len(req.Verifiers), l.Chain().Depth()+1)
	}
	raws, err := l.OpenLayers()
	if err != nil {
		return nil, err
	}
	readers := make([]io.ReaderAt, len(raws))
	verified := len(req.Verifiers) != 0
	for i, raw := range raws {
		var v *Verifier
		if len(req.Verifiers) != 0 {
			v = req.Verifiers[i]
		}
		chain, ok, err := wrapLower(raw, fmt.Sprintf("%s layer %d", l.Ref(), i), v, req.OnReadError, scope)
		if err != nil {
			closeAll(raws)
			return nil, err
		}
		verified = verified && ok
		readers[i] = layerReader{ReaderAt: chain, raw: raw}
	}
	r, err := layers.NewReader(l.Chain(), readers)
	if err != nil {
		closeAll(raws)
		return nil, err
	}
	return &Memory{raw: chainLower{r}, chain: r, size: r.Size(), verified: verified, opened: time.Now()}, nil
}

func closeAll(ls []Lower) {
	for _, l := range ls {
		l.Close()
	}
}

// layerReader is one layer as the chain reads it: its checked reads, and
// its lower for advice and closing.
type layerReader struct {
	io.ReaderAt
	raw Lower
}

func (l layerReader) Close() error { return l.raw.Close() }

func (l layerReader) Advise(off, length int64) error {
	if a, ok := l.raw.(Advisor); ok {
		return a.Advise(off, length)
	}
	return nil
}

// chainLower is the Lower of a layered memory: the chain reader, which
// advises each layer's span and closes every layer.
type chainLower struct{ *layers.Reader }

// ReadAt reads through the chain: only bytes that passed every check.
func (m *Memory) ReadAt(p []byte, off int64) (int, error) { return m.chain.ReadAt(p, off) }

// Size is the lower's size when it was opened.
func (m *Memory) Size() int64 { return m.size }

// Close closes the lower.
func (m *Memory) Close() error { return m.raw.Close() }

// Verified reports whether m checks what it serves. An attach asking for
// checked bytes never shares a generation that serves unchecked ones.
func (m *Memory) Verified() bool { return m.verified }

// Advise is the lower's Advisor; it does nothing (and returns nil) when
// the lower cannot be advised.
func (m *Memory) Advise(off, length int64) error {
	if a, ok := m.raw.(Advisor); ok {
		return a.Advise(off, length)
	}
	return nil
}

// LocalFile is the open local file the memory reads, when it is one (a
// File source): what FUSE passthrough hands the kernel to read instead
// of the device, unchecked. The descriptor stays the Memory's: it is
// valid until Close.
func (m *Memory) LocalFile() (*os.File, bool) {
	l, ok := m.raw.(*fileLower)
	if !ok {
		return nil, false
	}
	return l.File, true
}

// Advisable reports whether Advise reaches storage.
func (m *Memory) Advisable() bool {
	_, ok := m.raw.(Advisor)
	return ok
}

// ModTime is the lower's modification time when it reports one (a local
// file), else when it was opened.
func (m *Memory) ModTime() time.Time {
	if t, ok := m.raw.(interface{ ModTime() time.Time }); ok {
		return t.ModTime()
	}
	return m.opened
}

// boundReader runs each read under the scope's context.
type boundReader struct {
	cr    ContextReaderAt
	scope *ReadScope
}

func (b boundReader) ReadAt(p []byte, off int64) (int, error) {
	return b.cr.ReadAtContext(b.scope.Context(), p, off)
}

// watchedReader tells onError of every failed read.
type watchedReader struct {
	r       io.ReaderAt
	onError func(error)
}

func (w watchedReader) ReadAt(p []byte, off int64) (int, error) {
	n, err := w.r.ReadAt(p, off)
	if err != nil && !(errors.Is(err, io.EOF) && n == len(p)) {
		w.onError(err)
	}
	return n, err
}

// uncachingReader is the chain below the check, which asks the lower to
// drop a copy the check refused (integrity.Uncacher).
type uncachingReader struct {
	io.ReaderAt
	u integrity.Uncacher
}

func (r uncachingReader) Uncache(off, length int64) { r.u.Uncache(off, length) }
func (r uncachingReader) Refuse(off, length int64)  { r.u.Refuse(off, length) }

// precheckingReader is the chain below the check of a lower that checks
// some blocks itself (ContextPrechecker): its prechecked reads run as the
// chain's do, under the scope's context and told to onError.
type precheckingReader struct {
	uncachingReader
	pc      ContextPrechecker
	scope   *ReadScope
	onError func(error)
}

// ReadAtPrechecked implements integrity.Prechecker.
func (r precheckingReader) ReadAtPrechecked(p []byte, off int64, t *integrity.Table, checked []bool) (int, error) {
	ctx := context.Background()
	if r.scope != nil {
		ctx = r.scope.Context()
	}
	n, err := r.pc.ReadAtPrecheckedContext(ctx, p, off, t, checked)
	if err != nil && r.onError != nil && !(errors.Is(err, io.EOF) && n == len(p)) {
		r.onError(err)
	}
	return n, err
}
