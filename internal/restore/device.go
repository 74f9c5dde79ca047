package restore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"warmstart/internal/config"
	"warmstart/internal/integrity"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/prefetch"
	"warmstart/internal/repository"
	"warmstart/internal/vmm"
)

// memoryDevice is the memory device one restore holds: what the VMM maps
// or faults through, and what prefetch fills. The restore sequence is the
// same for every device; what differs lives behind these methods.
type memoryDevice interface {
	// kind is config.DeviceFile or config.DeviceUffd; it names the device's prefetch
	// key space.
	kind() string
	// generation numbers the device: a file device generation, shared by
	// every restore attached to it, or one VM's uffd session.
	generation() uint64
	// configure tells the VMM how to reach the device.
	configure(spec *vmm.RestoreSpec)
	// servesBeforeVM is true when the device is complete before the VMM
	// starts, so prefetch can begin first.
	servesBeforeVM() bool
	// connect starts completing the device for the VMM about to be
	// started, and returns the wait for it: a VMM may use the device
	// before its Restore returns (Firecracker faults through the uffd
	// device inside its snapshot load). wait(vm) waits until vm has
	// connected; wait(nil), once the VMM has failed to start, stops
	// waiting and returns the device's own failure, if it failed first
	// (its driver then stopped the VMM for it).
	connect(ctx context.Context) (wait func(vm vmm.Instance) error)
	// target is where prefetch of plan goes, and what to run once the
	// task has ended.
	target(p Policy, plan []prefetch.Range) (prefetch.Target, func(), error)
	// gone is closed if the device stops serving before the VM is asked
	// to stop; nil for a device that cannot.
	gone() <-chan struct{}
	// explain adds what the device saw to a failure of the VM.
	explain(snapshot string, err error) error
	// whyGone is why the device stopped serving, once gone is closed.
	whyGone() error
	counters() memdev.Counters
	stopTrace() []memdev.Touch
	// orphans reports whether the VM can no longer be served, so it could
	// not act on a stop request.
	orphans() bool
	// endReads ends, with cause, the reads of remote memory the device
	// has in progress and those to come, unless another restore still
	// running shares them (remotereads.go); it reports whether it ended
	// them. Only the first call counts.
	endReads(cause error) bool
	// release gives the device back once the VM has exited and prefetch
	// reads have drained, and waits for its acknowledgement; forget is
	// called when no restore can use the device's prefetch tasks again.
	release(ctx context.Context, forget func()) error
}

// fileDevice is a generation of the FUSE device: a file the VMM maps
// MAP_PRIVATE, shared by the restores of one snapshot.
type fileDevice struct {
	dev *fusedev.Device
	// srv is the mount serving it (Restorer.FUSE or PrefetchFUSE);
	// generation numbers are unique across mounts.
	srv *fusedev.Server
	// remote is the first damaged read of a remote lower this restore
	// opened (remotedamage.go).
	remote *remoteDamage
	// reads are the generation's remote reads, which this restore joined;
	// nil for a local memory file.
	reads    *generationReads
	endOnce  sync.Once
	readsEnd bool
}

// fileServer is the mount a restore's file device is attached on: the
// prefetching mount when there is one and the restore means to prefetch
// (a manifest that then fails validation leaves it there, reading on
// demand page by page), else the serving mount.
func (r *Restorer) fileServer(src Source, opts Options) *fusedev.Server {
	if r.PrefetchFUSE != nil && r.meansToPrefetch(src, opts) {
		return r.PrefetchFUSE
	}
	return r.FUSE
}

func (r *Restorer) attachFile(src Source, opts Options, digests *integrity.Table) (*fileDevice, error) {
	srv := r.fileServer(src, opts)
	if srv == nil {
		return nil, errors.New("file device: no FUSE server")
	}
	key := opts.DeviceKey
	if key == "" {
		key = src.SnapshotID
	}
	damage := r.remoteDamageOf(src)
	dev, reads, err := attachFileDevice(srv, key, src, opts.IOEngine, r.fileVerifier(src, digests), damage)
	if err != nil {
		return nil, fmt.Errorf("attach memory device: %w", integrityIf(err))
	}
	d := &fileDevice{dev: dev, srv: srv, remote: damage, reads: reads}
	if opts.IOEngine == config.IOEngineDirect {
		if err := fusedev.CheckMappable(dev.Path()); err != nil {
			d.endReads(err)
			d.release(context.Background(), func() {})
			return nil, err
		}
	}
	if opts.Trace {
		dev.StartTrace()
	}
	return d, nil
}

func (d *fileDevice) kind() string         { return config.DeviceFile }
func (d *fileDevice) generation() uint64   { return d.dev.Generation() }
func (d *fileDevice) servesBeforeVM() bool { return true }
func (d *fileDevice) connect(context.Context) func(vmm.Instance) error {
	return func(vmm.Instance) error { return nil }
}
func (d *fileDevice) gone() <-chan struct{}     { return nil }
func (d *fileDevice) counters() memdev.Counters { return d.dev.Counters() }
func (d *fileDevice) stopTrace() []memdev.Touch { return d.dev.StopTrace() }
func (d *fileDevice) orphans() bool             { return false }
func (d *fileDevice) whyGone() error            { return nil }

func (d *fileDevice) endReads(cause error) bool {
	d.endOnce.Do(func() {
		if d.reads != nil {
			d.readsEnd = d.reads.leave(cause)
		}
	})
	return d.readsEnd
}

func (d *fileDevice) configure(spec *vmm.RestoreSpec) {
	spec.Backend, spec.MemPath = vmm.BackendFile, d.dev.Path()
}

// target reads through the device file (a buffered pread warms the page
// cache the guest faults from) or has the device fill its own cache. The
// open file also keeps the kernel's inode, which a fill stores into; it
// stays open until the task has ended.
func (d *fileDevice) target(p Policy, plan []prefetch.Range) (prefetch.Target, func(), error) {
	f, err := os.Open(d.dev.Path())
	if err != nil {
		return nil, nil, fmt.Errorf("open device file for prefetch: %w", err)
	}
	var t prefetch.Target = fileTarget{f}
	if p.Fill {
		t = fillTarget{d.dev}
	}
	if p.Hint {
		go hintPlan(d.dev.Advise, plan)
	}
	return t, func() { f.Close() }, nil
}

// explain names the bad block the device refused to serve: the VM died
// on a page it could not have.
func (d *fileDevice) explain(snapshot string, err error) error {
	if c := d.dev.Corruption(); c != nil && !errors.Is(err, integrity.ErrCorrupt) {
		return markIntegrity(fmt.Errorf("snapshot %s: memory %w (%w)", snapshot, c, err))
	}
	if c := d.remote.err(); c != nil && !errors.Is(err, repository.ErrIntegrity) {
		return markIntegrity(fmt.Errorf("snapshot %s: memory: %w (%w)", snapshot, c, err))
	}
	return integrityIf(err)
}

func (d *fileDevice) release(ctx context.Context, forget func()) error {
	select {
	case <-d.dev.Release():
		if d.dev.ReleasedLast() {
			forget()
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for memory device release: %w", ctx.Err())
	}
}

// uffdSessions numbers uffd sessions: prefetch on the uffd device is per VM.
var uffdSessions atomic.Uint64

// uffdDevice is Firecracker's Uffd backend for one VM: a handler on a Unix
// socket, and once the VMM has connected, the session serving its faults.
type uffdDevice struct {
	r           *Restorer
	lowerPath   string
	handler     *uffd.Handler
	session     *uffd.Session
	number      uint64
	handlerGone chan struct{}
	markGone    func()
	unlink      func()
	trace       bool
}

func (r *Restorer) listenUffd(src Source, opts Options, runDir string, digests *integrity.Table, o memdev.Observer) (*uffdDevice, error) {
	if err := checkDevice(src, opts.Device); err != nil {
		return nil, err
	}
	sock, unlink, err := socketPath(runDir, "uffd.sock")
	if err != nil {
		return nil, fmt.Errorf("uffd socket: %w", err)
	}
	uo := r.uffdOptions(src, digests, opts.Trace)
	uo.Observer = o
	h, err := uffd.Listen(sock, src.MemoryPath, uo)
	if err != nil {
		unlink()
		return nil, fmt.Errorf("uffd handler: %w", integrityIf(err))
	}
	d := &uffdDevice{r: r, lowerPath: src.MemoryPath, handler: h, number: uffdSessions.Add(1),
		handlerGone: make(chan struct{}), unlink: unlink, trace: opts.Trace}
	d.markGone = sync.OnceFunc(func() { close(d.handlerGone) })
	return d, nil
}

func (d *uffdDevice) kind() string          { return config.DeviceUffd }
func (d *uffdDevice) generation() uint64    { return d.number }
func (d *uffdDevice) servesBeforeVM() bool  { return false }
func (d *uffdDevice) gone() <-chan struct{} { return d.handlerGone }

// configure hands the VMM the socket, and the channel that tells a driver
// the handler stopped serving: it then kills the VM, which would otherwise
// hang on its next missing page.
func (d *uffdDevice) configure(spec *vmm.RestoreSpec) {
	spec.Backend, spec.MemPath = vmm.BackendUffd, d.handler.SocketPath()
	spec.HandlerDone = d.handlerGone
}

// connect accepts the VMM from now on, before it is started, and serves
// its faults as soon as it connects: Firecracker connects, and faults,
// inside its snapshot load, which answers only once those faults are
// served. A failed accept marks the device gone, which has the driver
// stop a VMM still loading.
func (d *uffdDevice) connect(ctx context.Context) func(vmm.Instance) error {
	ctx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	accepted := make(chan struct{})
	var err error
	go func() {
		defer close(accepted)
		var s *uffd.Session
		if s, err = d.r.acceptVMM(ctx, d.handler, exited); err != nil {
			d.markGone()
			return
		}
		d.session = s
		go func() {
			<-s.Done()
			d.markGone()
		}()
		if d.r.sessionHook != nil {
			d.r.sessionHook(s)
		}
	}()
	return func(vm vmm.Instance) error {
		defer cancel()
		if vm == nil {
			cancel()
			<-accepted
			return d.startFailure(err)
		}
		// A VMM whose Restore returned before it connected may yet die
		// first; its exit ends the wait.
		ex, _ := vm.(vmm.Exiter)
		if ex != nil {
			go func() {
				select {
				case <-ex.Exited():
					close(exited)
				case <-accepted:
				}
			}()
		}
		<-accepted
		if errors.Is(err, uffd.ErrExitedBeforeConnect) && ex != nil {
			return fmt.Errorf("%w: %s", err, ex.ExitStatus())
		}
		return err
	}
}

// startFailure is why the device stopped serving a VMM that then failed to
// start, or nil when it did not stop first: the VMM's own failure, its
// exit included, and a wait ended by its failure, are the VMM's to report.
func (d *uffdDevice) startFailure(acceptErr error) error {
	switch {
	case acceptErr != nil && !errors.Is(acceptErr, context.Canceled) && !errors.Is(acceptErr, context.DeadlineExceeded):
		return acceptErr
	case d.session == nil || !d.orphans() || errors.Is(d.session.Err(), uffd.ErrVMMExited):
		return nil
	}
	return fmt.Errorf("page-fault handler stopped while the VMM loaded the snapshot: %w", d.session.Err())
}

// target installs into this VM's memory; the hint goes to the lower
// file's page cache, which the handler reads from.
func (d *uffdDevice) target(p Policy, plan []prefetch.Range) (prefetch.Target, func(), error) {
	if p.Hint {
		go hintFile(d.lowerPath, plan)
	}
	return installTarget{d.session}, nil, nil
}

func (d *uffdDevice) explain(_ string, err error) error { return integrityIf(err) }

// endReads has nothing to end: the uffd device serves local files only.
func (d *uffdDevice) endReads(error) bool { return false }

func (d *uffdDevice) whyGone() error {
	if d.session == nil {
		return errors.New("no VMM connected")
	}
	return d.session.Err()
}

func (d *uffdDevice) counters() memdev.Counters {
	if d.session == nil {
		return memdev.Counters{}
	}
	return d.session.Counters()
}

func (d *uffdDevice) stopTrace() []memdev.Touch {
	d.session.StopTrace()
	return d.session.Trace()
}

// orphans is true when the handler never served the VM or has stopped: a
// guest fault on a missing page then blocks for ever.
func (d *uffdDevice) orphans() bool {
	if d.session == nil {
		return true
	}
	select {
	case <-d.session.Done():
		return true
	default:
		return false
	}
}

func (d *uffdDevice) release(_ context.Context, forget func()) error {
	var errs []error
	if d.session != nil {
		if err := d.session.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close uffd session: %w", err))
		}
	}
	// A session left in a read fails the handler's close too; once said
	// is enough.
	if err := d.handler.Close(); err != nil && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("close uffd handler: %w", err))
	}
	d.unlink()
	forget()
	return errors.Join(errs...)
}

// hintPlan advises storage of every range of the plan, in order. Hints
// only start reads; a failed one costs nothing but speed, so it stops the
// hinting and nothing else.
func hintPlan(advise func(off, length int64) error, plan []prefetch.Range) {
	for _, r := range plan {
		if advise(r.Offset, r.Length) != nil {
			return
		}
	}
}

// hintFile is hintPlan for a lower file the restore reaches by path.
func hintFile(path string, plan []prefetch.Range) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	hintPlan(func(off, length int64) error {
		return unix.Fadvise(int(f.Fd()), off, length, unix.FADV_WILLNEED)
	}, plan)
}
