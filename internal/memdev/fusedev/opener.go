package fusedev

import (
	"context"
	"errors"
	"fmt"
	"os"

	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/vmm"
)

// Opener attaches file devices (memdev.KindFile) on a node's mounts: the
// serving mount, and the prefetching one for restores that mean to
// prefetch (a mount whose readaround window is narrower, so that each of
// the guest's faults reaches the device as the page it touched; a nil
// Prefetching serves those restores from Serving too). A manifest that
// then fails validation leaves such a restore there, reading on demand
// page by page.
type Opener struct {
	Serving, Prefetching *Server
}

// NewOpener is the opener of the file devices on serving and prefetching.
func NewOpener(serving, prefetching *Server) *Opener {
	return &Opener{Serving: serving, Prefetching: prefetching}
}

var (
	_ memdev.Opener          = (*Opener)(nil)
	_ memdev.PrefetchChecker = (*Opener)(nil)
)

// Kind implements memdev.Opener.
func (o *Opener) Kind() string { return memdev.KindFile }

// Open implements memdev.Opener: it attaches req.Key on the mount req
// asks for. Direct I/O (io_engine 2) is checked to map as the VMM will map
// it (CheckMappable), and req.Trace (re)starts the generation's trace.
func (o *Opener) Open(req memdev.Request) (memdev.Device, error) {
	srv := o.Serving
	if req.Prefetching && o.Prefetching != nil {
		srv = o.Prefetching
	}
	if srv == nil {
		return nil, errors.New("file device: no FUSE server")
	}
	d, err := srv.Attach(req.Key, req)
	if err != nil {
		return nil, err
	}
	if req.IOEngine == memdev.IOEngineDirect {
		if err := CheckMappable(d.Path()); err != nil {
			d.EndReads(err)
			d.Release(context.Background())
			return nil, err
		}
	}
	if req.Trace {
		d.StartTrace()
	}
	return d, nil
}

// errDirectPrefetch is why a restore on io_engine 2 does not prefetch.
var errDirectPrefetch = errors.New("io_engine 2 (direct I/O): prefetch not validated for this engine")

// CheckPrefetch implements memdev.PrefetchChecker: prefetch through direct
// I/O would bypass the very page cache the VMM faults from (the seed skips
// it, and so does warmstart).
func (o *Opener) CheckPrefetch(req memdev.Request) error {
	if req.IOEngine == memdev.IOEngineDirect {
		return errDirectPrefetch
	}
	return nil
}

var (
	_ memdev.Device             = (*Device)(nil)
	_ memdev.Tracer             = (*Device)(nil)
	_ memdev.ReadEnder          = (*Device)(nil)
	_ memdev.CorruptionReporter = (*Device)(nil)
	_ memdev.Sharer             = (*Device)(nil)
	_ memdev.Mapped             = (*Device)(nil)
	_ memdev.ObserverRemover    = (*Device)(nil)
)

// ID implements memdev.Device: generation numbers are unique across the
// process's mounts.
func (d *Device) ID() memdev.ID { return memdev.ID{Kind: memdev.KindFile, Generation: d.gen.number} }

// Configure implements memdev.Device: the VMM maps the device file.
func (d *Device) Configure(_ context.Context, spec *vmm.RestoreSpec) error {
	spec.Backend, spec.MemPath = vmm.BackendFile, d.Path()
	return nil
}

// Done implements memdev.Device: the file device serves until released.
func (d *Device) Done() <-chan struct{} { return nil }

// Err implements memdev.Device.
func (d *Device) Err() error { return nil }

// MappedPath implements memdev.Mapped.
func (d *Device) MappedPath() string { return d.Path() }

// EndReads implements memdev.ReadEnder: this reference leaves the
// generation's read scope, once; the last holder to leave ends the reads
// of a lower on an object store.
func (d *Device) EndReads(cause error) bool {
	d.endOnce.Do(func() {
		if d.joined {
			d.ended = d.gen.scope.Leave(cause)
		}
	})
	return d.ended
}

// Target implements memdev.Device. It reads through the device file (a
// buffered pread warms the page cache the guest faults from) or, with
// o.Fill, has the device fill its own cache. The open file also keeps the
// kernel's inode, which a fill stores into; it stays open until done.
// o.Hint advises the lower of the whole plan up front: when the target is
// first used, so that of the targets of restores that join one task (the
// task reads through the first one's), only the one used reaches storage.
func (d *Device) Target(plan []prefetch.Range, o memdev.TargetOptions) (prefetch.Target, func(), error) {
	f, err := os.Open(d.Path())
	if err != nil {
		return nil, nil, fmt.Errorf("open device file for prefetch: %w", err)
	}
	var t prefetch.Target = fileTarget{f}
	// A writable view is read through its file, never filled (fill.go).
	if o.Fill && d.gen.overlay == nil {
		t = fillTarget{d}
	}
	if !o.Hint {
		return t, func() { f.Close() }, nil
	}
	h := memdev.NewPlanHint(d.Advise, plan)
	return hintingTarget{t, h}, func() { h.Stop(); f.Close() }, nil
}

// hintingTarget starts its plan's hint at its first fetch, ahead of it.
type hintingTarget struct {
	prefetch.Target
	hint *memdev.PlanHint
}

func (t hintingTarget) Fetch(ctx context.Context, off int64, buf []byte) error {
	t.hint.Start()
	return t.Target.Fetch(ctx, off, buf)
}

// fileTarget reads through the device file the VMM maps: a buffered pread
// there is what warms the page cache the guest will fault from.
type fileTarget struct{ f *os.File }

func (t fileTarget) Fetch(ctx context.Context, off int64, buf []byte) error {
	return prefetch.ReaderTarget(t.f).Fetch(ctx, off, buf)
}

// fillTarget has the device read the lower and store the bytes in the
// device file's page cache.
type fillTarget struct{ d *Device }

func (t fillTarget) Fetch(_ context.Context, off int64, buf []byte) error {
	return t.d.Fill(off, buf)
}
