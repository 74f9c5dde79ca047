package restoretest

import (
	"context"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/prefetch"
	"warmstart/internal/vmm"
)

// Devices are the devices a node's restorer attaches through, on the
// given mounts: the file device on serving (restores that mean to
// prefetch on prefetching, when it is not nil), then the uffd device.
func Devices(serving, prefetching *fusedev.Server) memdev.Devices {
	return memdev.Devices{fusedev.NewOpener(serving, prefetching), uffd.NewOpener(0)}
}

// Watch is what a test watches of the devices a restorer opens: every
// field is optional.
type Watch struct {
	// Target wraps each prefetch target a device hands out (to hold or
	// count reads).
	Target func(prefetch.Target) prefetch.Target
	// Observer is told of every range each device serves, after the
	// restore's own observer.
	Observer memdev.Observer
	// Opened is told of each device as soon as it is open.
	Opened func(memdev.Device)
	// Connected is told of each device the VMM connects to
	// (memdev.Connecter), once it has connected.
	Connected func(memdev.Device)
}

// Devices returns ds with every opener watched by w. A watched device
// implements the optional interfaces of the one it wraps: Connecter
// exactly when that one does, the others by forwarding, which does what
// an absent interface does when the device lacks it.
func (w Watch) Devices(ds memdev.Devices) memdev.Devices {
	out := make(memdev.Devices, len(ds))
	for i, o := range ds {
		out[i] = watchedOpener{o, w}
	}
	return out
}

type watchedOpener struct {
	memdev.Opener
	w Watch
}

// CheckPrefetch forwards memdev.PrefetchChecker.
func (o watchedOpener) CheckPrefetch(req memdev.Request) error {
	if c, ok := o.Opener.(memdev.PrefetchChecker); ok {
		return c.CheckPrefetch(req)
	}
	return nil
}

func (o watchedOpener) Open(req memdev.Request) (memdev.Device, error) {
	if o.w.Observer != nil {
		req.Observer = tee{req.Observer, o.w.Observer}
	}
	dev, err := o.Opener.Open(req)
	if err != nil {
		return nil, err
	}
	if o.w.Opened != nil {
		o.w.Opened(dev)
	}
	d := &watched{Device: dev, w: o.w}
	if _, ok := dev.(memdev.Connecter); ok {
		return &watchedConnecter{d}, nil
	}
	return d, nil
}

type tee struct{ a, b memdev.Observer }

func (t tee) Served(kind memdev.Kind, off int64, n int, took time.Duration) {
	if t.a != nil {
		t.a.Served(kind, off, n, took)
	}
	t.b.Served(kind, off, n, took)
}

// watched is a device whose targets w wraps.
type watched struct {
	memdev.Device
	w Watch
}

func (d *watched) Target(plan []prefetch.Range, o memdev.TargetOptions) (prefetch.Target, func(), error) {
	t, done, err := d.Device.Target(plan, o)
	if err == nil && d.w.Target != nil {
		t = d.w.Target(t)
	}
	return t, done, err
}

func (d *watched) StopTrace() []memdev.Touch {
	if t, ok := d.Device.(memdev.Tracer); ok {
		return t.StopTrace()
	}
	return nil
}

func (d *watched) EndReads(cause error) bool {
	if e, ok := d.Device.(memdev.ReadEnder); ok {
		return e.EndReads(cause)
	}
	return false
}

func (d *watched) Corruption() error {
	if c, ok := d.Device.(memdev.CorruptionReporter); ok {
		return c.Corruption()
	}
	return nil
}

func (d *watched) Share() (memdev.Device, error) {
	if s, ok := d.Device.(memdev.Sharer); ok {
		return s.Share()
	}
	return nil, memdev.ErrNotShared
}

func (d *watched) MappedPath() string {
	if m, ok := d.Device.(memdev.Mapped); ok {
		return m.MappedPath()
	}
	return ""
}

func (d *watched) StopObserving() {
	if r, ok := d.Device.(memdev.ObserverRemover); ok {
		r.StopObserving()
	}
}

// watchedConnecter is a watched device the VMM connects to.
type watchedConnecter struct{ *watched }

func (d *watchedConnecter) Connect(ctx context.Context, vm vmm.VM) error {
	err := d.Device.(memdev.Connecter).Connect(ctx, vm)
	if err == nil && vm != nil && d.w.Connected != nil {
		d.w.Connected(d.Device)
	}
	return err
}
