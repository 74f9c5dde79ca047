package replay

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/bits"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"warmstart/internal/layout"
	"warmstart/internal/trace"
	"warmstart/internal/userfaultfd"
	"warmstart/internal/vmm"
)

// Environment of the child process.
const (
	// RoleReplayVMM is the role (reexec.Env) of the replay VMM: ChildMain.
	RoleReplayVMM = "replay-vmm"
	// ConfigEnv carries the child's Config as JSON.
	ConfigEnv = "WARMSTART_REPLAY_CONFIG"
)

// controlFD is the child's descriptor of the control channel: the first of
// exec.Cmd.ExtraFiles.
const controlFD = 3

// MaxShadowBytes bounds the private copy of touched pages that lets the
// hash be computed after the ready time is taken.
const MaxShadowBytes = 2 << 30

// ErrConfig is wrapped by errors that reject a Config.
var ErrConfig = errors.New("invalid replay vmm configuration")

// Range is a run of guest memory by logical offset, in bytes.
type Range struct {
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

// Config is what one replay VMM run needs.
type Config struct {
	Backend vmm.Backend `json:"backend"`
	// MemPath is the memory file (File) or the handler's socket (Uffd).
	MemPath   string        `json:"mem_path"`
	Layout    layout.Layout `json:"layout"`
	TracePath string        `json:"trace_path"`
	// Remove lists ranges to drop with MADV_DONTNEED after the trace and
	// touch again (Uffd only: the File backend has no remove events, and
	// there the pages would read back from the file).
	Remove []Range `json:"remove,omitempty"`
	// Paused maps memory (and hands it to the handler) but touches nothing
	// until the resume command, as Firecracker's resume_vm = false.
	Paused bool `json:"paused,omitempty"`
	// WriteStamp, when not zero, makes each write entry store
	// StampOf(WriteStamp, offset) in the first 8 bytes of its page, so
	// written pages differ from the snapshot's (a pause then has changed
	// pages to save); zero keeps a write's content as it was.
	WriteStamp uint64 `json:"write_stamp,omitempty"`
}

// Validate checks c without touching the file system.
func (c Config) Validate() error {
	if c.Backend != vmm.BackendFile && c.Backend != vmm.BackendUffd {
		return fmt.Errorf("%w: backend %q, want %q or %q", ErrConfig, c.Backend, vmm.BackendFile, vmm.BackendUffd)
	}
	if c.MemPath == "" || c.TracePath == "" {
		return fmt.Errorf("%w: memory path and trace path are required", ErrConfig)
	}
	if err := c.Layout.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	for i, r := range c.Layout.Regions {
		if c.Backend == vmm.BackendFile && r.PageSize != trace.PageBytes {
			return fmt.Errorf("%w: region %d has %d-byte pages: the File backend maps only %d-byte pages", ErrConfig, i, r.PageSize, trace.PageBytes)
		}
	}
	return c.checkRemove()
}

// checkRemove checks the remove ranges: the Uffd backend's only, each
// aligned to the pages of the one region it lies in.
func (c Config) checkRemove() error {
	if len(c.Remove) > 0 && c.Backend != vmm.BackendUffd {
		return fmt.Errorf("%w: remove ranges need the %s backend", ErrConfig, vmm.BackendUffd)
	}
	for _, r := range c.Remove {
		if r.Offset%trace.PageBytes != 0 || r.Length%trace.PageBytes != 0 || !c.Layout.Contains(r.Offset, r.Length) {
			return fmt.Errorf("%w: remove range [%d, +%d) is not page aligned inside one region", ErrConfig, r.Offset, r.Length)
		}
		i, _ := c.Layout.RegionAt(r.Offset)
		if ps := c.Layout.Regions[i].PageSize; r.Offset%ps != 0 || r.Length%ps != 0 {
			return fmt.Errorf("%w: remove range [%d, +%d) is not aligned to the region's %d-byte pages", ErrConfig, r.Offset, r.Length, ps)
		}
	}
	return nil
}

// event is one line of the control channel.
type event struct {
	Event        string `json:"event"`
	PID          int    `json:"pid,omitempty"`
	SHA256       string `json:"sha256,omitempty"`
	StartNs      int64  `json:"start_ns,omitempty"`
	FirstTouchNs int64  `json:"first_touch_ns,omitempty"`
	ReadyNs      int64  `json:"ready_ns,omitempty"`
	TouchedPages int    `json:"touched_pages,omitempty"`
	RemovedPages int    `json:"removed_pages,omitempty"`
	Error        string `json:"error,omitempty"`
}

const (
	eventStarted = "started"
	eventPaused  = "paused"
	eventReady   = "ready"
	eventError   = "error"
	eventStopped = "stopped"
)

// ChildMain runs the replay VMM: the entry point of role RoleReplayVMM,
// which every executable that restores with the replay VMM lists in the
// roles its main (and TestMain) dispatches. It returns the exit status.
func ChildMain() int {
	control := os.NewFile(controlFD, "control")
	var cfg Config
	err := json.Unmarshal([]byte(os.Getenv(ConfigEnv)), &cfg)
	if err != nil {
		err = fmt.Errorf("%w: %s: %v", ErrConfig, ConfigEnv, err)
		writeEvent(control, event{Event: eventError, Error: err.Error()})
	} else {
		err = Run(cfg, control, ReadCommands(os.Stdin))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "replay-vmm: %v\n", err)
		return 1
	}
	return 0
}

// Commands are what a parent tells a running replay VMM.
type Commands struct {
	// Resume closes when a paused VMM may run its guest.
	Resume <-chan struct{}
	// Stop closes when the VMM must stop.
	Stop <-chan struct{}
	// Requests are the pause commands (pause.go) a ready VMM serves.
	Requests <-chan string
}

// ReadCommands reads commands from r, one per line: "resume", and "stop";
// the end of r (or a read error) also means stop, as do SIGINT and SIGTERM.
// Other lines are ignored.
func ReadCommands(r io.Reader) Commands {
	resume, stop := make(chan struct{}), make(chan struct{})
	requests := make(chan string, maxPendingRequests)
	inputDone := make(chan struct{})
	go func() {
		defer close(inputDone)
		resumed := false
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			switch strings.TrimSpace(sc.Text()) {
			case "resume":
				if !resumed {
					close(resume)
					resumed = true
				}
			case "stop":
				return
			default:
				forwardRequest(requests, strings.TrimSpace(sc.Text()))
			}
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		select {
		case <-sig:
		case <-inputDone:
		}
		signal.Stop(sig)
		close(stop)
	}()
	return Commands{Resume: resume, Stop: stop, Requests: requests}
}

// writeEvent writes one control line. A parent that has gone away is not an
// error here: the child then stops when its standard input ends.
func writeEvent(w io.Writer, e event) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	w.Write(append(b, '\n'))
}

// Run is the replay VMM: it maps memory per cfg, (when paused, waits for
// resume,) plays the trace, reports ready on control, waits for stop, and
// unmaps. Progress and failure are reported as control events; the
// returned error is the failure. A stop before ready abandons the trace and
// returns nil.
func Run(cfg Config, control io.Writer, cmds Commands) error {
	err := run(cfg, control, cmds)
	if err != nil {
		writeEvent(control, event{Event: eventError, Error: err.Error()})
		return err
	}
	writeEvent(control, event{Event: eventStopped})
	return nil
}

func run(cfg Config, control io.Writer, cmds Commands) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	entries, err := trace.ReadFile(cfg.TracePath)
	if err != nil {
		return err
	}
	if err := trace.Validate(entries, cfg.Layout); err != nil {
		return fmt.Errorf("trace %s: %w", cfg.TracePath, err)
	}
	p, err := newPlayer(cfg, entries)
	if err != nil {
		return err
	}
	defer p.close()

	start := time.Now()
	writeEvent(control, event{Event: eventStarted, PID: os.Getpid(), StartNs: start.UnixNano()})
	m, err := mapMemory(cfg)
	if err != nil {
		return err
	}
	defer m.close()
	if cfg.Paused {
		writeEvent(control, event{Event: eventPaused})
		select {
		case <-cmds.Resume:
		case <-cmds.Stop:
			return nil
		}
	}
	firstTouch, finished, err := p.play(m, entries, cfg.Remove, cmds.Stop)
	if err != nil {
		return err
	}
	if !finished {
		return nil
	}
	ready := time.Now()
	if firstTouch.IsZero() {
		firstTouch = ready // nothing to touch
	}
	sum := p.sum()
	writeEvent(control, event{
		Event: eventReady, SHA256: sum,
		StartNs: start.UnixNano(), FirstTouchNs: firstTouch.UnixNano(), ReadyNs: ready.UnixNano(),
		TouchedPages: p.touched, RemovedPages: p.removed,
	})
	return p.serve(m, control, cmds)
}

// memory is the VMM's guest memory: one mapping per layout region.
type memory struct {
	layout layout.Layout
	maps   [][]byte
	uffd   int // -1 in File mode
	conn   *net.UnixConn
}

func mapMemory(cfg Config) (_ *memory, err error) {
	m := &memory{layout: cfg.Layout, uffd: -1}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	if cfg.Backend == vmm.BackendFile {
		f, err := os.Open(cfg.MemPath)
		if err != nil {
			return nil, fmt.Errorf("open memory file: %w", err)
		}
		defer f.Close()
		for i, r := range cfg.Layout.Regions {
			b, err := unix.Mmap(int(f.Fd()), r.Offset, int(r.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_NORESERVE)
			if err != nil {
				return nil, fmt.Errorf("map region %d [%d, +%d) of %s: %w", i, r.Offset, r.Size, cfg.MemPath, err)
			}
			m.maps = append(m.maps, b)
		}
		return m, nil
	}

	fd, err := userfaultfd.Open()
	if err != nil {
		return nil, err
	}
	m.uffd = fd
	var mappings []userfaultfd.Mapping
	for i, r := range cfg.Layout.Regions {
		flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_NORESERVE
		if r.PageSize != trace.PageBytes {
			flags |= unix.MAP_HUGETLB | bits.TrailingZeros64(uint64(r.PageSize))<<unix.MAP_HUGE_SHIFT
		}
		b, err := unix.Mmap(-1, 0, int(r.Size), unix.PROT_READ|unix.PROT_WRITE, flags)
		if err != nil {
			return nil, fmt.Errorf("map region %d (%d bytes, %d-byte pages): %w", i, r.Size, r.PageSize, err)
		}
		m.maps = append(m.maps, b)
		addr := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		if err := userfaultfd.RegisterMissing(fd, addr, uintptr(r.Size)); err != nil {
			return nil, fmt.Errorf("region %d: %w", i, err)
		}
		mappings = append(mappings, userfaultfd.Mapping{BaseHostVirtAddr: uint64(addr), Size: uint64(r.Size), Offset: uint64(r.Offset), PageSize: uint64(r.PageSize)})
	}
	m.conn, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: cfg.MemPath, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("connect to page-fault handler: %w", err)
	}
	if err := userfaultfd.SendHandshake(m.conn, mappings, fd); err != nil {
		return nil, err
	}
	return m, nil
}

// page returns the 4 KiB of guest memory at logical offset off.
func (m *memory) page(off int64) []byte {
	i, _ := m.layout.RegionAt(off) // trace.Validate checked every offset
	rel := off - m.layout.Regions[i].Offset
	return m.maps[i][rel : rel+trace.PageBytes : rel+trace.PageBytes]
}

// span returns the guest memory of r, which lies inside one region.
func (m *memory) span(r Range) []byte {
	i, _ := m.layout.RegionAt(r.Offset)
	rel := r.Offset - m.layout.Regions[i].Offset
	return m.maps[i][rel : rel+r.Length]
}

func (m *memory) close() {
	for _, b := range m.maps {
		unix.Munmap(b)
	}
	m.maps = nil
	if m.conn != nil {
		m.conn.Close()
	}
	if m.uffd >= 0 {
		unix.Close(m.uffd)
		m.uffd = -1
	}
}

// player plays a trace and keeps what the hash covers.
type player struct {
	seen    []uint64 // bitmap of pages already touched, by page number
	shadow  []byte   // copies of first-touched pages, in order; nil: hash inline
	used    int
	inline  hash.Hash
	touched int
	removed int
	// stamp is Config.WriteStamp; dirty the pages written since the last
	// dump (pause.go).
	stamp uint64
	dirty dirtySet
}

func newPlayer(cfg Config, entries []trace.Entry) (*player, error) {
	p := &player{seen: make([]uint64, (cfg.Layout.FileSize/trace.PageBytes+63)/64), stamp: cfg.WriteStamp}
	pages := int64(trace.Summarize(entries).Pages)
	for _, r := range cfg.Remove {
		pages += r.Length / trace.PageBytes
	}
	if size := pages * trace.PageBytes; size > MaxShadowBytes {
		p.inline = sha256.New()
	} else if size > 0 {
		// MAP_POPULATE faults the buffer in now, outside the timed run.
		b, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		if err != nil {
			return nil, fmt.Errorf("allocate %d-byte page copy buffer: %w", size, err)
		}
		p.shadow = b
	}
	return p, nil
}

func (p *player) close() {
	if p.shadow != nil {
		unix.Munmap(p.shadow)
		p.shadow = nil
	}
}

// record adds a page's content to what the hash covers.
func (p *player) record(page []byte) {
	if p.inline != nil {
		p.inline.Write(page)
		return
	}
	p.used += copy(p.shadow[p.used:], page)
}

func (p *player) sum() string {
	if p.inline != nil {
		return hex.EncodeToString(p.inline.Sum(nil))
	}
	s := sha256.Sum256(p.shadow[:p.used])
	return hex.EncodeToString(s[:])
}

// sink keeps touch loads observable.
var sink atomic.Uint32

// touch makes the page's first access: a load, or for a write an atomic add
// of zero, which faults as a write and leaves the content as it was.
func touch(page []byte, write bool) {
	word := (*uint32)(unsafe.Pointer(unsafe.SliceData(page)))
	if write {
		atomic.AddUint32(word, 0)
	} else {
		sink.Store(atomic.LoadUint32(word))
	}
}

// play touches every entry, then removes and re-touches cfg's ranges. It
// returns when the first touch began and whether the trace ran to the end
// (false: stop arrived first). A fault on guest memory (SIGBUS from a file
// that shrank, SIGSEGV) becomes an error rather than a crash.
func (p *player) play(m *memory, entries []trace.Entry, remove []Range, stop <-chan struct{}) (firstTouch time.Time, finished bool, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	var at int64 = -1
	defer func() {
		if r := recover(); r != nil {
			addr := ""
			if fault, ok := r.(interface{ Addr() uintptr }); ok {
				addr = fmt.Sprintf(" (address %#x)", fault.Addr())
			}
			err = fmt.Errorf("memory fault touching logical offset %d%s: %v", at, addr, r)
		}
	}()

	var pace pacer
	pace.reset()
	for i, e := range entries {
		if i%64 == 0 && stopped(stop) {
			return firstTouch, false, nil
		}
		if !pace.wait(e.Compute, stop) {
			return firstTouch, false, nil
		}
		if i == 0 {
			firstTouch = time.Now()
		}
		at = e.Offset
		page := m.page(e.Offset)
		p.touch(page, e)
		if n := e.Offset / trace.PageBytes; p.seen[n/64]&(1<<(n%64)) == 0 {
			p.seen[n/64] |= 1 << (n % 64)
			p.record(page)
			p.touched++
		}
		pace.reset()
	}
	for _, r := range remove {
		if stopped(stop) {
			return firstTouch, false, nil
		}
		at = r.Offset
		if err := unix.Madvise(m.span(r), unix.MADV_DONTNEED); err != nil {
			return firstTouch, false, fmt.Errorf("madvise DONTNEED [%d, +%d): %w", r.Offset, r.Length, err)
		}
		if firstTouch.IsZero() {
			firstTouch = time.Now()
		}
		for off := r.Offset; off < r.Offset+r.Length; off += trace.PageBytes {
			at = off
			page := m.page(off)
			touch(page, false)
			p.record(page)
			p.removed++
		}
	}
	return firstTouch, true, nil
}

func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}
