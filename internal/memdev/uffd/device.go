package uffd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/vmm"
)

// Opener attaches uffd devices (memdev.KindUffd): one handler per VM, on
// a socket in the restore's private directory, serving any memory
// (memdev.Memory: a local file, or an object store read through the node
// cache, checked against the snapshot's digest table either way).
type Opener struct {
	// ConnectTimeout bounds how long a restore waits for its VMM to
	// connect, from just before the VMM is started; DefaultConnectTimeout
	// when zero. A VMM that exits first ends the wait at once.
	ConnectTimeout time.Duration
}

// NewOpener is the opener of uffd devices waiting connectTimeout for
// their VMM.
func NewOpener(connectTimeout time.Duration) *Opener {
	return &Opener{ConnectTimeout: connectTimeout}
}

var _ memdev.Opener = (*Opener)(nil)

// Kind implements memdev.Opener.
func (o *Opener) Kind() string { return memdev.KindUffd }

// sessions numbers uffd devices: prefetch on the uffd device is per VM,
// and its keys are never reused.
var sessions atomic.Uint64

// Open implements memdev.Opener: it opens req's memory and listens for
// the VMM on a socket in req.RunDir. req.Key and req.IOEngine do not
// apply: the device is this VM's alone, and has no I/O engine.
func (o *Opener) Open(req memdev.Request) (memdev.Device, error) {
	sock, unlink, err := socketPath(req.RunDir, "uffd.sock")
	if err != nil {
		return nil, fmt.Errorf("uffd socket: %w", err)
	}
	scope := memdev.NewReadScope()
	scope.Join()
	mem, err := memdev.OpenMemory(req, scope)
	if err != nil {
		unlink()
		return nil, fmt.Errorf("uffd handler: %w", err)
	}
	h, err := Listen(sock, mem, Options{Trace: req.Trace, Observer: req.Observer})
	if err != nil {
		mem.Close()
		unlink()
		return nil, fmt.Errorf("uffd handler: %w", err)
	}
	timeout := o.ConnectTimeout
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
	}
	d := &Device{handler: h, mem: mem, scope: scope, number: sessions.Add(1), unlink: unlink,
		connectTimeout: timeout, done: make(chan struct{}), accepted: make(chan struct{}), exited: make(chan struct{})}
	d.markDone = sync.OnceFunc(func() { close(d.done) })
	d.markExited = sync.OnceFunc(func() { close(d.exited) })
	return d, nil
}

// Device is Firecracker's Uffd backend for one VM: a handler on a Unix
// socket, and once the VMM has connected, the session serving its faults.
// It implements memdev.Device and memdev.Connecter, memdev.Tracer and
// memdev.ReadEnder.
type Device struct {
	handler        *Handler
	mem            *memdev.Memory
	scope          *memdev.ReadScope
	number         uint64
	unlink         func()
	connectTimeout time.Duration

	// The accept Configure starts: accepted closes once it has ended, with
	// session or acceptErr set; exited closes when the VMM exits before
	// (Connect watches it); cancelAccept ends the wait.
	cancelAccept context.CancelFunc
	accepted     chan struct{}
	exited       chan struct{}
	markExited   func()
	session      *Session
	acceptErr    error

	// done closes when the device stops serving: the accept failed or the
	// session ended.
	done     chan struct{}
	markDone func()

	endOnce sync.Once
	ended   bool

	// hintMu guards hints, the storage hints of the plans Target was
	// given, and released, set when Release began.
	hintMu   sync.Mutex
	hints    []*memdev.PlanHint
	released bool
}

var (
	_ memdev.Device    = (*Device)(nil)
	_ memdev.Connecter = (*Device)(nil)
	_ memdev.Tracer    = (*Device)(nil)
	_ memdev.ReadEnder = (*Device)(nil)
)

// ID implements memdev.Device: one number per VM, never reused.
func (d *Device) ID() memdev.ID { return memdev.ID{Kind: memdev.KindUffd, Generation: d.number} }

// Configure implements memdev.Device: the VMM connects to the socket, and
// its driver kills the VM once the handler stops serving
// (RestoreSpec.HandlerDone), since the VM would otherwise hang on its next
// missing page. It starts accepting the VMM from now on, before the VMM is
// started, and serves its faults as soon as it connects: Firecracker
// connects, and faults, inside its snapshot load, which answers only once
// those faults are served. A failed accept closes Done, which has the
// driver stop a VMM still loading.
func (d *Device) Configure(ctx context.Context, spec *vmm.RestoreSpec) error {
	spec.Backend, spec.MemPath = vmm.BackendUffd, d.handler.SocketPath()
	spec.HandlerDone = d.done
	ctx, d.cancelAccept = context.WithCancel(ctx)
	go d.accept(ctx)
	return nil
}

// accept waits for the VMM to connect and hand over its userfaultfd. The
// wait ends with an error when the VMM exits first (Connect closes exited)
// or the connect timeout passes, so that a VMM that died during startup
// fails the restore at once rather than leave it waiting.
func (d *Device) accept(ctx context.Context) {
	s, err := d.handler.AcceptWith(ctx, AcceptOptions{ConnectTimeout: d.connectTimeout, VMMExited: d.exited})
	if err != nil {
		d.acceptErr = fmt.Errorf("accept the VMM's userfaultfd: %w", err)
		close(d.accepted) // before Done: whoever sees Done closed reads Err
		d.markDone()
		return
	}
	d.session = s
	close(d.accepted)
	go func() {
		<-s.Done()
		d.markDone()
	}()
}

// Connect implements memdev.Connecter: it waits for Configure's accept.
// A VMM whose Restore returned before it connected may yet die first; its
// exit ends the wait, and the error carries its exit status. A nil vm (it
// failed to start) ends the wait at once: Connect then returns why the
// device stopped serving, when it did first, else nil.
func (d *Device) Connect(ctx context.Context, vm vmm.VM) error {
	if d.cancelAccept == nil {
		return errors.New("uffd device: Connect before Configure")
	}
	defer d.cancelAccept()
	if vm == nil {
		d.cancelAccept()
		<-d.accepted
		return d.startFailure()
	}
	ex, _ := vm.(vmm.Exiter)
	if ex != nil {
		go func() {
			select {
			case <-ex.Exited():
				d.markExited()
			case <-d.accepted:
			}
		}()
	}
	<-d.accepted
	if errors.Is(d.acceptErr, ErrExitedBeforeConnect) && ex != nil {
		return fmt.Errorf("%w: %s", d.acceptErr, ex.ExitStatus())
	}
	return d.acceptErr
}

// startFailure is why the device stopped serving a VMM that then failed to
// start, or nil when it did not stop first: the VMM's own failure, its
// exit included, and a wait ended by its failure, are the VMM's to report.
func (d *Device) startFailure() error {
	err := d.acceptErr
	switch {
	case err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
		return err
	case d.session == nil || !d.stopped() || errors.Is(d.session.Err(), ErrVMMExited):
		return nil
	}
	return fmt.Errorf("page-fault handler stopped while the VMM loaded the snapshot: %w", d.session.Err())
}

// stopped reports whether the session has stopped serving.
func (d *Device) stopped() bool {
	select {
	case <-d.session.Done():
		return true
	default:
		return false
	}
}

// Session is the session serving the VM, once it has connected (nil
// before, and when the accept failed).
func (d *Device) Session() *Session {
	select {
	case <-d.accepted:
		return d.session
	default:
		return nil
	}
}

// Target implements memdev.Device: prefetch installs into this VM's
// memory; the hint goes to the lower (a local file's page cache), which
// the handler reads from.
func (d *Device) Target(plan []prefetch.Range, o memdev.TargetOptions) (prefetch.Target, func(), error) {
	s := d.Session()
	if s == nil {
		return nil, nil, errors.New("uffd device: no VMM connected")
	}
	if o.Hint {
		d.startHint(plan)
	}
	return installTarget{s}, nil, nil
}

// startHint advises the lower of plan in the background, until Release
// (stopHint); a device already released hints nothing.
func (d *Device) startHint(plan []prefetch.Range) {
	d.hintMu.Lock()
	defer d.hintMu.Unlock()
	if d.released {
		return
	}
	h := memdev.NewPlanHint(d.mem.Advise, plan)
	d.hints = append(d.hints, h)
	h.Start()
}

// stopHint ends the storage hints and waits for their advice in progress:
// the lower they advise closes next, and none starts after. An advice
// stuck on storage that stopped answering holds the release no longer than
// a stuck read would (closeWait); it holds the lower's descriptor until it
// returns, so it never reaches another file.
func (d *Device) stopHint() {
	d.hintMu.Lock()
	d.released = true
	hints := d.hints
	d.hintMu.Unlock()
	for _, h := range hints {
		h.Cancel()
	}
	bound := time.NewTimer(closeWait)
	defer bound.Stop()
	for _, h := range hints {
		select {
		case <-h.Ended():
		case <-bound.C:
			return
		}
	}
}

// installTarget installs ranges into one VM's memory through its session.
// The engine's buffer is unused: the session stages its own copy.
type installTarget struct{ s *Session }

func (t installTarget) Fetch(ctx context.Context, off int64, buf []byte) error {
	return t.s.Install(ctx, off, int64(len(buf)))
}

// Counters implements memdev.Device: the session's reads of the lower.
func (d *Device) Counters() memdev.Counters {
	if s := d.Session(); s != nil {
		return s.Counters()
	}
	return memdev.Counters{}
}

// Done implements memdev.Device: it closes when the accept failed or the
// session stopped serving.
func (d *Device) Done() <-chan struct{} { return d.done }

// Err implements memdev.Device: why the device stopped serving.
func (d *Device) Err() error {
	select {
	case <-d.accepted:
	default:
		return nil
	}
	if d.session == nil {
		return d.acceptErr
	}
	return d.session.Err()
}

// StopTrace implements memdev.Tracer.
func (d *Device) StopTrace() []memdev.Touch {
	s := d.Session()
	if s == nil {
		return nil
	}
	s.StopTrace()
	return s.Trace()
}

// EndReads implements memdev.ReadEnder: the VM's reads of a lower on an
// object store end, once.
func (d *Device) EndReads(cause error) bool {
	d.endOnce.Do(func() { d.ended = d.scope.Leave(cause) })
	return d.ended
}

// Release implements memdev.Device: it closes the session and the handler
// (with it the lower) and removes the socket. A uffd device is one VM's,
// so its release is always the last.
func (d *Device) Release(context.Context) (last bool, err error) {
	d.stopHint()
	if d.cancelAccept != nil {
		d.cancelAccept()
		<-d.accepted
	}
	d.EndReads(fmt.Errorf("memory device released: %w", context.Canceled))
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
	return true, errors.Join(errs...)
}
