package memdev

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"warmstart/internal/prefetch"
	"warmstart/internal/vmm"
)

// Device kinds, as [memory] device, --device and the API's "device" name
// them, like vmm.BackendFile and vmm.BackendUffd.
const (
	KindFile = "file" // a file on a FUSE mount, mapped MAP_PRIVATE (package fusedev)
	KindUffd = "uffd" // Firecracker's Uffd backend (package uffd)
)

// KindBackend is the memory backend the VMM restores with on a device of
// kind: File for the file device, Uffd for the uffd device; "" for a kind
// no device has.
func KindBackend(kind string) vmm.Backend {
	switch kind {
	case KindFile:
		return vmm.BackendFile
	case KindUffd:
		return vmm.BackendUffd
	}
	return ""
}

// I/O engines of the file device ([memory] io_engine): how the VMM's
// reads of the device file reach the device. These constants and
// ValidIOEngine are the one range check of the value.
const (
	// IOEngineBuffered and IOEngineBufferedAsync read through the kernel
	// page cache, which the file's generation keeps (FOPEN_KEEP_CACHE).
	IOEngineBuffered      = 0
	IOEngineBufferedAsync = 1
	// IOEngineDirect bypasses the page cache (FOPEN_DIRECT_IO).
	IOEngineDirect = 2
)

// ValidIOEngine reports whether n names an I/O engine.
func ValidIOEngine(n int) bool { return n >= IOEngineBuffered && n <= IOEngineDirect }

// ID names a device in the prefetch engine's key space. Generation is
// unique in the process among devices of Kind. Restores on one ID share
// its prefetch tasks.
type ID struct {
	Kind       string
	Generation uint64
}

// TargetOptions are what a prefetch policy asks of the device.
type TargetOptions struct {
	// Fill asks a device with a page cache of its own to store the bytes
	// there itself, not read them through its file (fusedev: Device.Fill).
	Fill bool
	// Hint advises the lower of the whole plan up front (Advisor).
	Hint bool
}

// Device is the memory one restore's VM reaches guest memory through. A
// restore holds it from Opener.Open to Release. The restore sequence is the
// same for every device. What differs lives behind these methods and the
// optional interfaces below, which a caller asserts for, as with io/fs.
type Device interface {
	ID() ID
	// Configure tells the VMM how to reach the device, and starts what must
	// run while the VMM loads the snapshot (uffd: the accept and the fault
	// loop, before the load is sent).
	Configure(ctx context.Context, spec *vmm.RestoreSpec) error
	// Target is where prefetch of plan goes. done (possibly nil) runs once
	// the engine's task has ended. An error means on-demand reads.
	Target(plan []prefetch.Range, o TargetOptions) (t prefetch.Target, done func(), err error)
	// Counters are the generation's reads of its lower so far.
	Counters() Counters
	// Done closes if the device stops serving before Release: its VM would
	// hang on the next fault. It is nil for a device that cannot stop on
	// its own. Err says why it closed.
	Done() <-chan struct{}
	Err() error
	// Release gives the device back once the VM has exited and the
	// prefetch reads have drained, and waits for the acknowledgement that
	// no read is in flight. last: no other holder remains, so the restore
	// forgets the device's prefetch tasks.
	Release(ctx context.Context) (last bool, err error)
}

// Passthrougher is a device that can have the kernel serve the guest's
// reads of a local lower file itself (FUSE passthrough): no block is
// checked before the guest sees it, and the device sees none of the
// guest's faults.
type Passthrougher interface {
	// Passthrough reports whether the device's file is opened in
	// passthrough mode, as far as the device can tell: on, and no read
	// request reached it that passthrough would have kept from it.
	Passthrough() bool
}

// Connecter is a device the VMM connects to once it runs (uffd). A device
// without it serves before the VMM runs: prefetch may start first.
type Connecter interface {
	// Connect waits, after VMM.Restore returned, for the VMM's connection
	// that Configure's accept took. It ends early with the VMM's exit
	// status when the VMM dies first, and with its own error on timeout.
	// With a nil vm (the VMM failed to start) it stops waiting and returns
	// the device's own failure, when the device failed first (its VMM
	// driver then stopped the VMM for it), else nil.
	Connect(ctx context.Context, vm vmm.VM) error
}

// Tracer is a device that records the first touch of each page
// (Request.Trace). StopTrace stops recording and returns the touches.
type Tracer interface{ StopTrace() []Touch }

// ReadEnder is a device whose holder can end its reads of the lower:
// ReadScope.Leave for this holder. Only the first call counts; it reports
// whether it ended reads.
type ReadEnder interface{ EndReads(cause error) bool }

// CorruptionReporter is a device that keeps the first bad block its
// generation met (fusedev): a VM that then failed died on a page it could
// not have.
type CorruptionReporter interface{ Corruption() error }

// Sharer is a device that gives another reference to its generation
// (fusedev: the daemon's hold), which reads its counters and is released
// on its own. A device without it is one VM's (ErrNotShared).
type Sharer interface{ Share() (Device, error) }

// Mapped is a device whose VMM maps a file (fusedev): its path, for the
// residency of the VMM's mappings at ready.
type Mapped interface{ MappedPath() string }

// ObserverRemover is a device whose generation serves on after this
// restore's guest is ready (fusedev, shared between VMs): StopObserving
// drops Request.Observer.
type ObserverRemover interface{ StopObserving() }

// Request is what one restore asks of an Opener.
type Request struct {
	// Key is what a shared device is shared under: the snapshot id, or a
	// private key (the recorder's).
	Key    string
	Memory Source
	// Verifier checks every block before it is served; nil serves it
	// unverified (no table, or the lab's +noverify).
	Verifier *Verifier
	// Verifiers check a Layered source's layers, one per layer,
	// index-aligned with its chain (Verifier is then unused); empty
	// serves them unverified.
	Verifiers []*Verifier
	// Observer, when set, is told of every range served.
	Observer Observer
	// OnReadError, when set, is told of each failed read of the lower a
	// generation made by this request opened.
	OnReadError func(error)
	// Trace records the first touches (Tracer).
	Trace bool
	// IOEngine is the file device's; other devices ignore it.
	IOEngine int
	// Prefetching says the restore means to prefetch (fusedev: its
	// prefetching mount).
	Prefetching bool
	// RunDir is the restore's private directory (uffd: its socket).
	RunDir string
	// Writable asks for a device the VMM may write guest memory back to
	// (a pausable QEMU restore maps it shared): the writes go to a private
	// overlay in RunDir, never to the memory, and the device is this
	// restore's alone. A device that cannot fails the open.
	Writable bool
}

// WriteTracker is a Writable device: it knows which pages the VMM wrote.
type WriteTracker interface {
	// FreezeWritten writes the pages written since the last freeze (or the
	// attach) to a new sparse file at path, at their offsets, and returns
	// their page indexes ascending; the next freeze starts from none. The
	// VMM must be paused and its writes flushed to the device.
	FreezeWritten(path string) (pages []int64, err error)
	// Flush makes the kernel write back what the VMM wrote through its
	// mapping and still holds dirty, so the device has seen every write.
	Flush() error
}

// Opener attaches the devices of one kind.
type Opener interface {
	Kind() string
	Open(req Request) (Device, error)
}

// PrefetchChecker is an Opener that cannot prefetch some requests. It says
// why before anything is attached (fusedev: io_engine 2, whose direct I/O
// bypasses the page cache that prefetch warms).
type PrefetchChecker interface{ CheckPrefetch(req Request) error }

// Devices are the openers a restorer attaches through. The first is the
// default for an empty kind.
type Devices []Opener

// Opener returns the opener of kind. An unknown kind fails with
// ErrUnknownDevice, naming the kinds there are.
func (ds Devices) Opener(kind string) (Opener, error) {
	if kind == "" && len(ds) > 0 {
		return ds[0], nil
	}
	kinds := make([]string, len(ds))
	for i, o := range ds {
		if o.Kind() == kind {
			return o, nil
		}
		kinds[i] = o.Kind()
	}
	return nil, fmt.Errorf("%w %q (want %s)", ErrUnknownDevice, kind, strings.Join(kinds, " or "))
}

var (
	// ErrUnknownDevice is wrapped by Devices.Opener for a kind it lacks.
	ErrUnknownDevice = errors.New("unknown memory device")
	// ErrConflict is wrapped when a device key is attached with other
	// parameters than its generation's (the daemon answers 409).
	ErrConflict = errors.New("device key attached with different parameters")
	// ErrNotShared is a device that is one VM's and cannot be shared.
	ErrNotShared = errors.New("device is one VM's and cannot be shared")
)
