package uffd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
	"warmstart/internal/userfaultfd"
)

var (
	// ErrVMMExited is the reason a session stops when its VMM process has
	// exited.
	ErrVMMExited = errors.New("VMM exited")
	// ErrLowerFile is wrapped when the lower file cannot supply a page. A
	// fault that cannot be served this way fails the session: serving any
	// other bytes would corrupt the guest.
	ErrLowerFile = errors.New("lower file read failed")
	// ErrNotMapped is wrapped when an address or logical offset lies in no
	// region of the session.
	ErrNotMapped = errors.New("not in any mapped region")
	// ErrPageRefused is wrapped when the kernel keeps answering a copy
	// into a faulting page with EEXIST while the VMM keeps faulting on it:
	// the page can never be populated (a huge page region with no huge
	// pages to give), and serving on would loop for ever.
	ErrPageRefused = errors.New("the kernel refuses the page yet the VMM faults on it again")
)

// maxRefusedCopies is how many faults in a row on one page, each answered
// by a copy the kernel refused with EEXIST and a wake, fail the session. A
// copy racing an Install that placed the page is refused once and the
// thread goes on; only a page the kernel cannot populate comes back.
const maxRefusedCopies = 64

// retryIntervalMillis is how long a copy refused with EAGAIN waits before it
// is tried again when no event arrives. The kernel refuses copies while a
// REMOVE event is unread, and goes on refusing until the thread that raised
// it has resumed after the event was read; nothing announces that moment.
const retryIntervalMillis = 1

// msgBatch is how many uffd_msg one read(2) takes.
const msgBatch = 64

// Stats are the decisions a session's fault handler has made.
type Stats struct {
	// Faults counts page-fault messages read from the userfaultfd.
	Faults uint64 `json:"faults"`
	// ZeroPages counts faults on removed pages, answered with zeros.
	ZeroPages uint64 `json:"zero_pages"`
	// ExistWakes counts faults on pages already present (UFFDIO_COPY
	// failed with EEXIST, or the page was known present), answered with a
	// wake.
	ExistWakes uint64 `json:"exist_wakes"`
	// AgainRetries counts copies refused with EAGAIN because a remove
	// event was pending, and retried after draining events.
	AgainRetries uint64 `json:"again_retries"`
	// Removes counts UFFD_EVENT_REMOVE events.
	Removes uint64 `json:"removes"`
	// RemovedBytes counts bytes of mapped memory marked removed.
	RemovedBytes uint64 `json:"removed_bytes"`
	// InstalledBytes counts bytes Install copied into the guest.
	InstalledBytes uint64 `json:"installed_bytes"`
	// InstallExisting counts pages Install found already present (EEXIST).
	InstallExisting uint64 `json:"install_existing"`
}

type statSet struct {
	faults, zeroPages, existWakes, againRetries, removes, removedBytes, installedBytes, installExisting atomic.Uint64
}

func (s *statSet) load() Stats {
	return Stats{
		Faults:          s.faults.Load(),
		ZeroPages:       s.zeroPages.Load(),
		ExistWakes:      s.existWakes.Load(),
		AgainRetries:    s.againRetries.Load(),
		Removes:         s.removes.Load(),
		RemovedBytes:    s.removedBytes.Load(),
		InstalledBytes:  s.installedBytes.Load(),
		InstallExisting: s.installExisting.Load(),
	}
}

// region is one validated mapping with the index of its first page in the
// session's page bitmaps.
type region struct {
	userfaultfd.Mapping
	firstPage int
}

func (r *region) fileEnd() uint64 { return r.Offset + r.Size }

func (r *region) pageIndex(addr uint64) int {
	return r.firstPage + int((addr-r.BaseHostVirtAddr)/r.PageSize)
}

func (r *region) hostAddr(logical uint64) uint64 { return r.BaseHostVirtAddr + logical - r.Offset }

// Session serves the page faults of one VMM.
//
// One goroutine reads the userfaultfd and serves faults one at a time;
// Install may run on any number of other goroutines. The kernel serialises
// the copies; the session's removal lock orders them against REMOVE events
// (see Install).
type Session struct {
	h        *Handler
	lower    io.ReaderAt
	uffd     int
	pidfd    int
	stopfd   int
	byAddr   []*region // sorted by host address
	byOffset []*region // sorted by file offset
	hooks    *testHooks
	chunk    int

	counters memdev.CounterSet
	stats    statSet

	// mu orders Install's copies against the dequeueing of REMOVE events,
	// and the descriptors' lifetime against their use: the serving
	// goroutine reads the userfaultfd and marks removed pages under mu
	// held for writing; Install checks marks and copies under it held for
	// reading; the descriptors are closed under it held for writing.
	mu      sync.RWMutex
	closed  bool
	removed pageBits // pages the guest discarded: faults get zeros
	present pageBits // pages this session installed and the guest kept
	// demanded marks pages a fault of this session reported (and copied
	// in, or found placed): a thread interrupted by a signal before its
	// wake faults on the page again, and that repeat is the same demand
	// request, not another one.
	demanded pageBits

	drainMu sync.Mutex
	drained chan struct{} // closed and replaced after each event drain

	trace tracer

	// refusedPage and refusedCopies count faults in a row on one page
	// whose copy the kernel refused with EEXIST (maxRefusedCopies); only
	// the serving goroutine uses them.
	refusedPage   uint64
	refusedCopies int

	stopOnce sync.Once
	// closeBound is closed closeWait after the first Close: every Close
	// waits for the fault loop until then, not closeWait each.
	closeBound chan struct{}
	done       chan struct{}
	err        error
	buffers    sync.Pool
}

func newSession(h *Handler, mappings []userfaultfd.Mapping, uffd, pidfd int) (*Session, error) {
	stopfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("uffd session: eventfd: %w", err)
	}
	s := &Session{
		h:       h,
		lower:   h.lower,
		uffd:    uffd,
		pidfd:   pidfd,
		stopfd:  stopfd,
		hooks:   h.opts.hooks,
		chunk:   h.opts.InstallChunkBytes,
		drained: make(chan struct{}),
		done:    make(chan struct{}),
	}
	pages := 0
	for _, m := range mappings {
		r := &region{Mapping: m, firstPage: pages}
		pages += int(m.Size / m.PageSize)
		s.byAddr = append(s.byAddr, r)
		s.byOffset = append(s.byOffset, r)
		s.chunk = max(s.chunk, int(m.PageSize))
	}
	sort.Slice(s.byAddr, func(i, j int) bool { return s.byAddr[i].BaseHostVirtAddr < s.byAddr[j].BaseHostVirtAddr })
	sort.Slice(s.byOffset, func(i, j int) bool { return s.byOffset[i].Offset < s.byOffset[j].Offset })
	s.removed = newPageBits(pages)
	s.present = newPageBits(pages)
	s.demanded = newPageBits(pages)
	s.trace.pages = pages
	if h.opts.Trace {
		s.trace.start()
	}
	chunk := s.chunk
	s.buffers.New = func() any { b := make([]byte, chunk); return &b }
	return s, nil
}

// Mappings returns the regions the VMM registered, sorted by file offset.
func (s *Session) Mappings() []userfaultfd.Mapping {
	out := make([]userfaultfd.Mapping, len(s.byOffset))
	for i, r := range s.byOffset {
		out[i] = r.Mapping
	}
	return out
}

// Counters returns the session's lower-file counters: one read request per
// fault served from the lower file and per Install run.
func (s *Session) Counters() memdev.Counters { return s.counters.Load() }

// Stats returns the fault handler's decision counters.
func (s *Session) Stats() Stats { return s.stats.load() }

// Done is closed when the session stops serving: on Close, when the VMM
// exits, or on a failure. From then on, a guest fault on a page not yet
// present blocks for ever, so the restore path stops the VM when Done closes.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is why serving stopped: nil before Done closes and after Close,
// an error wrapping ErrVMMExited when the VMM exited, or the failure.
func (s *Session) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Close stops serving and closes the session's descriptors, and waits until
// the serving goroutine has returned and every Install has let go of the
// userfaultfd. The VMM keeps its own copy of the userfaultfd, so its guest
// stalls on the next missing page. A fault loop blocked in a read of
// storage that stopped answering cannot be interrupted: once closeWait
// has passed since the first Close, every Close returns an error saying
// so, and the loop closes the descriptors when the read returns.
func (s *Session) Close() error {
	s.stop()
	return s.waitClosed()
}

// stop asks the fault loop to stop, once, and starts the close bound.
func (s *Session) stop() {
	s.stopOnce.Do(func() {
		s.closeBound = make(chan struct{})
		time.AfterFunc(closeWait, func() { close(s.closeBound) })
		s.mu.RLock()
		defer s.mu.RUnlock()
		if s.closed {
			return
		}
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		// One write to a fresh eventfd cannot fail: its counter is far
		// from overflowing.
		unix.Write(s.stopfd, one[:])
	})
}

// waitClosed waits for the fault loop to have returned, until the close
// bound; a loop that has returned is never reported stuck, however late.
func (s *Session) waitClosed() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	select {
	case <-s.done:
		return nil
	case <-s.closeBound:
		return fmt.Errorf("uffd session: the fault loop is still in a read of the memory source after %v; it closes the userfaultfd when the read returns", closeWait)
	}
}

// defaultCloseWait is how long Close waits for a read still in progress
// (memdev.StuckReadWait).
const defaultCloseWait = memdev.StuckReadWait

// closeWait is defaultCloseWait; tests shorten it.
var closeWait = defaultCloseWait

// serve runs the fault loop until it stops, then releases the descriptors.
func (s *Session) serve() {
	err := s.loop()
	s.mu.Lock()
	s.closed = true
	unix.Close(s.uffd)
	unix.Close(s.pidfd)
	unix.Close(s.stopfd)
	s.err = err
	s.mu.Unlock()
	close(s.done)
	s.h.forget(s)
}

// fault is a page-fault message not yet answered.
type fault struct {
	addr uint64
}

func (s *Session) loop() error {
	msgs := make([]byte, userfaultfd.MsgBytes*msgBatch)
	var pending []fault
	var pageBuf, zeroBuf []byte
	maxPage := 0
	for _, r := range s.byAddr {
		maxPage = max(maxPage, int(r.PageSize))
	}
	pageBuf = make([]byte, maxPage)
	if maxPage > userfaultfd.PageSizeBytes {
		zeroBuf = make([]byte, maxPage)
	}
	pfds := []unix.PollFd{
		{Fd: int32(s.uffd), Events: unix.POLLIN},
		{Fd: int32(s.stopfd), Events: unix.POLLIN},
		{Fd: int32(s.pidfd), Events: unix.POLLIN},
	}
	for {
		timeout := -1
		if len(pending) > 0 {
			timeout = retryIntervalMillis
		}
		for i := range pfds {
			pfds[i].Revents = 0
		}
		if _, err := unix.Poll(pfds, timeout); err != nil {
			if err == unix.EINTR {
				continue
			}
			return fmt.Errorf("poll userfaultfd: %w", err)
		}
		if pfds[1].Revents != 0 {
			return nil
		}
		if pfds[2].Revents != 0 {
			return ErrVMMExited
		}
		if pfds[0].Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
			return fmt.Errorf("poll userfaultfd: revents %#x", pfds[0].Revents)
		}
		var err error
		if pending, err = s.drain(msgs, pending); err != nil {
			return err
		}
		if pending, err = s.servePending(pending, pageBuf, zeroBuf); err != nil {
			return err
		}
	}
}

// drain reads every queued message. REMOVE events are applied at once, and
// under mu held for writing, so that an Install that copies after the event
// was read (and the discarding thread released) sees the pages as removed.
// Faults are appended to pending in the order they arrived.
func (s *Session) drain(buf []byte, pending []fault) ([]fault, error) {
	s.mu.Lock()
	defer func() {
		s.mu.Unlock()
		s.drainMu.Lock()
		close(s.drained)
		s.drained = make(chan struct{})
		s.drainMu.Unlock()
	}()
	for {
		n, err := unix.Read(s.uffd, buf)
		if err == unix.EAGAIN {
			return pending, nil
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return pending, fmt.Errorf("read userfaultfd: %w", err)
		}
		if n == 0 || n%userfaultfd.MsgBytes != 0 {
			return pending, fmt.Errorf("read userfaultfd: %d bytes is not a whole number of messages", n)
		}
		for off := 0; off < n; off += userfaultfd.MsgBytes {
			m := userfaultfd.DecodeMsg(buf[off : off+userfaultfd.MsgBytes])
			switch m.Event {
			case userfaultfd.EventPagefault:
				s.stats.faults.Add(1)
				pending = append(pending, fault{addr: m.Arg1})
				s.noteFault(m.Arg1)
			case userfaultfd.EventRemove:
				s.stats.removes.Add(1)
				s.markRemoved(m.Arg0, m.Arg1)
			default:
				// FORK, REMAP and UNMAP are only sent when asked for at
				// UFFDIO_API time, which the VMM does not do.
				return pending, fmt.Errorf("userfaultfd: unexpected event %#x", m.Event)
			}
		}
	}
}

// drainedSignal returns a channel closed after the next event drain.
func (s *Session) drainedSignal() <-chan struct{} {
	s.drainMu.Lock()
	defer s.drainMu.Unlock()
	return s.drained
}

// markRemoved records that the guest discarded [start, end). Called with
// mu held for writing.
func (s *Session) markRemoved(start, end uint64) {
	for _, r := range s.byAddr {
		lo := max(start, r.BaseHostVirtAddr)
		hi := min(end, r.BaseHostVirtAddr+r.Size)
		if lo >= hi {
			continue
		}
		lo = lo &^ (r.PageSize - 1)
		hi = (hi + r.PageSize - 1) &^ (r.PageSize - 1)
		for a := lo; a < hi; a += r.PageSize {
			i := r.pageIndex(a)
			s.removed.set(i)
			s.present.clear(i)
			s.demanded.clear(i)
		}
		s.stats.removedBytes.Add(hi - lo)
	}
}

func (s *Session) regionByAddr(addr uint64) *region {
	i := sort.Search(len(s.byAddr), func(i int) bool {
		r := s.byAddr[i]
		return r.BaseHostVirtAddr+r.Size > addr
	})
	if i < len(s.byAddr) && s.byAddr[i].BaseHostVirtAddr <= addr {
		return s.byAddr[i]
	}
	return nil
}

func (s *Session) regionByOffset(off uint64) *region {
	i := sort.Search(len(s.byOffset), func(i int) bool { return s.byOffset[i].fileEnd() > off })
	if i < len(s.byOffset) && s.byOffset[i].Offset <= off {
		return s.byOffset[i]
	}
	return nil
}

// noteFault records the fault's page as touched if tracing.
func (s *Session) noteFault(addr uint64) {
	if !s.trace.active.Load() {
		return
	}
	r := s.regionByAddr(addr)
	if r == nil {
		return
	}
	page := addr &^ (r.PageSize - 1)
	s.trace.record(r.pageIndex(page), int64(r.Offset+page-r.BaseHostVirtAddr))
}

// copyFromLower serves a fault on page (at addr, of ps bytes, page index
// idx, at logical offset in the memory file) with the lower file's bytes,
// read into buf. It returns the copy's own error (EEXIST, EAGAIN, ESRCH)
// for serveFault to act on, or an error wrapping ErrLowerFile or
// ErrPageRefused that fails the session.
func (s *Session) copyFromLower(addr, page, ps uint64, idx int, logical int64, buf []byte) error {
	began := time.Now()
	s.counters.Begin(int(ps))
	got, rerr := s.lower.ReadAt(buf, logical)
	s.counters.End(int(ps), got, rerr)
	if rerr != nil {
		return fmt.Errorf("fault at %#x: %w: page at offset %d: %w", addr, ErrLowerFile, logical, rerr)
	}
	// Reported before the copy: the copy wakes the guest, which may then
	// finish and report ready before this goroutine runs again, and a
	// restore takes its events at ready. A copy that is retried, or
	// refused because the page arrived meanwhile, reports nothing more.
	if !s.demanded.test(idx) {
		s.demanded.set(idx)
		if o := s.h.opts.Observer; o != nil {
			o.Served(memdev.Demand, logical, int(ps), time.Since(began))
		}
	}
	if s.hooks != nil && s.hooks.beforeFaultCopy != nil {
		s.hooks.beforeFaultCopy(logical)
	}
	// buf is a Go heap slice: the collector does not move it, and
	// KeepAlive keeps it allocated until the kernel has copied it.
	_, err := userfaultfd.Copy(s.uffd, uintptr(page), bufAddr(buf), ps, 0)
	runtime.KeepAlive(buf)
	if rerr := s.countRefused(page, err); rerr != nil {
		return fmt.Errorf("fault at %#x (%d-byte page at offset %d): %w", addr, ps, logical, rerr)
	}
	if err == nil {
		s.present.set(idx)
	}
	return err
}

// countRefused counts a fault's copy into page that the kernel refused
// with EEXIST, and fails once maxRefusedCopies faults in a row on the page
// were: the wake that follows each refusal sends the VMM straight back.
func (s *Session) countRefused(page uint64, copyErr error) error {
	if copyErr != unix.EEXIST {
		s.refusedCopies = 0
		return nil
	}
	if page != s.refusedPage {
		s.refusedPage, s.refusedCopies = page, 0
	}
	s.refusedCopies++
	if s.refusedCopies >= maxRefusedCopies {
		return fmt.Errorf("%w (UFFDIO_COPY: EEXIST %d times in a row; are huge pages available?)", ErrPageRefused, s.refusedCopies)
	}
	return nil
}

// errRetry says a copy was refused because a remove event is pending.
var errRetry = errors.New("retry after draining events")

// servePending answers faults in arrival order. A fault refused with EAGAIN
// stops the pass: it and the faults after it wait for the next drain.
func (s *Session) servePending(pending []fault, pageBuf, zeroBuf []byte) ([]fault, error) {
	for i, f := range pending {
		err := s.serveFault(f, pageBuf, zeroBuf)
		if errors.Is(err, errRetry) {
			s.stats.againRetries.Add(1)
			return append(pending[:0], pending[i:]...), nil
		}
		if err != nil {
			return nil, err
		}
	}
	return pending[:0], nil
}

func (s *Session) serveFault(f fault, pageBuf, zeroBuf []byte) error {
	r := s.regionByAddr(f.addr)
	if r == nil {
		return fmt.Errorf("fault at %#x: %w", f.addr, ErrNotMapped)
	}
	ps := r.PageSize
	page := f.addr &^ (ps - 1)
	idx := r.pageIndex(page)
	logical := int64(r.Offset + page - r.BaseHostVirtAddr)
	var err error
	switch {
	case s.removed.test(idx):
		// Counted before the ioctl wakes the guest, so that whoever sees
		// the guest read the page also sees it counted.
		s.stats.zeroPages.Add(1)
		if ps == userfaultfd.PageSizeBytes {
			_, err = userfaultfd.ZeroPage(s.uffd, uintptr(page), ps, 0)
		} else {
			// Hugetlbfs has no UFFDIO_ZEROPAGE.
			_, err = userfaultfd.Copy(s.uffd, uintptr(page), bufAddr(zeroBuf), ps, 0)
			runtime.KeepAlive(zeroBuf)
		}
		if err != nil {
			s.stats.zeroPages.Add(^uint64(0))
		}
	case s.present.testAndClear(idx):
		// A repeated fault (a thread interrupted by a signal faults again)
		// or one whose page Install placed without waking: wake without
		// reading the page again. The mark is dropped so that, should the
		// page somehow be missing after all, the thread's next fault reads
		// and copies it instead of being woken in a loop.
		err = unix.EEXIST
	default:
		if err = s.copyFromLower(f.addr, page, ps, idx, logical, pageBuf[:ps]); errors.Is(err, ErrLowerFile) || errors.Is(err, ErrPageRefused) {
			return err
		}
	}
	switch err {
	case nil:
		return nil
	case unix.EEXIST:
		s.stats.existWakes.Add(1)
		// The guest asked for a page an install placed (or is placing)
		// while it waited: a demand request all the same, which the
		// install's own report, sent once its run is done, may follow
		// only after ready. A repeat of a fault this session already
		// served is not a request of its own.
		if o := s.h.opts.Observer; o != nil && !s.demanded.test(idx) {
			o.Served(memdev.Demand, logical, int(ps), 0)
		}
		if werr := userfaultfd.Wake(s.uffd, uintptr(page), ps); werr != nil {
			return fmt.Errorf("UFFDIO_WAKE at %#x: %w", page, werr)
		}
		return nil
	case unix.EAGAIN:
		return errRetry
	case unix.ESRCH:
		return ErrVMMExited
	default:
		return fmt.Errorf("serve fault at %#x: %w", f.addr, err)
	}
}
