// Package fusedev is the file memory device: a FUSE mount, served by this
// process, that exposes each attached snapshot memory lower file as a
// read-only file. The VMM maps that file MAP_PRIVATE (Firecracker's File
// backend, QEMU's memory-backend-file,share=off); the prefetcher reads it
// with buffered reads so that the kernel page cache the VMM faults from is
// warm before the guest asks. It plays the part the seed's ublk memory
// device plays there.
//
// # Generations
//
// Attach hands out references to a device generation. The same key (a
// snapshot) attached again while referenced shares the generation; once the
// last reference is released the file is detached, and the next attach of
// that key gets a new generation with a new file name and a new inode, so it
// never shares page cache left behind by an older one. Release reports an
// acknowledgement only after every read the generation had in flight inside
// the server has returned, which is what allows the caller to drop or
// replace the lower file.
//
// # Caching and io_engine
//
// io_engine 0 and 1 open the file with FOPEN_KEEP_CACHE: the kernel page
// cache of a generation's file is kept across opens and shared by every
// process that maps or reads it, so one VMM's faults (or the prefetcher's
// reads) serve the next VMM without asking the server again.
//
// io_engine 2 opens it with FOPEN_DIRECT_IO. Measured on Linux 6.18, for a
// mapping of such a file:
//   - MAP_PRIVATE (what the VMM does) is allowed. Page faults are still
//     served through the page cache (mmap readaround, like io_engine 0), but
//     every new mmap of the file invalidates the file's whole page cache
//     first, so a second VMM reads everything from the server again, and
//     read(2) — the prefetcher's path — bypasses the page cache entirely and
//     warms nothing the VMM will fault from.
//   - MAP_SHARED is refused with ENODEV unless the connection negotiates
//     FUSE_DIRECT_IO_ALLOW_MMAP, which this package does not: guest memory
//     is never mapped shared.
//
// CheckMappable probes a device path the way the VMM will map it and wraps
// ErrNotMappable when the kernel refuses, so the restore path can fail with
// a clear message instead of a VMM error.
//
// # Read-only
//
// Device files are never written. The mount is read-only unless
// Options.AllowWriteOpen admits the O_RDWR open QEMU 7.2 makes before a
// MAP_PRIVATE mapping; a private mapping's writes stay in the VMM's own
// copy-on-write pages either way.
//
// # Tracing
//
// StartTrace switches on access tracing for a generation. Read requests
// reaching the server are the touches: each request for [off, off+len)
// records, in arrival order, the pages it covers that no earlier request
// covered, with the monotonic time since tracing started. With kernel
// readahead a request covers more than the page that faulted, and pages
// already in the page cache produce no request at all, so a trace is
// meaningful on a generation whose cache is cold.
//
// # Never touch served memory from this process
//
// A goroutine that faults on a mapping of a file this process serves blocks
// in the kernel outside a system call; the Go runtime's stop-the-world then
// waits for it forever and the process deadlocks. Consumers of device files
// are always other processes.
package fusedev

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
)

const (
	// DefaultMaxReadBytes is the largest read request the kernel may send
	// (max_read, max_pages). Readahead and readaround requests are cut to it.
	DefaultMaxReadBytes = 1 << 20
	// DefaultReadAheadBytes is the kernel readahead window of the mount. It
	// is also the readaround window of mmap faults: on Linux 6.18 a fault
	// that misses the page cache sends one request for this many bytes
	// centred on the faulting page (less where pages are already cached),
	// and a buffered 1 MiB read is sent as requests of this size. Measured
	// here on a 40 MiB clustered trace over 128 MiB, 128 KiB reached the
	// last touch soonest: 16-64 KiB sent 2-6 times as many requests and
	// 256 KiB-1 MiB read 20-90% more bytes, and both were slower.
	DefaultReadAheadBytes = 128 << 10
	// kernelReadAheadLimitBytes is the most FUSE_INIT can negotiate; larger
	// windows are set through the mount's backing-device sysfs knob.
	kernelReadAheadLimitBytes = 128 << 10
	// maxBackgroundRequests bounds the kernel's asynchronous (readahead)
	// requests queued to the server; the default of 12 throttles several
	// VMMs and prefetch readers faulting at once.
	maxBackgroundRequests = 64
	// cacheTimeout is how long the kernel may trust names and attributes:
	// a file's name carries its generation and its content never changes,
	// so they stay valid for as long as the file exists.
	cacheTimeout = time.Hour
	// fsName is shown as the mount's source and type suffix ("fuse.warmstart").
	fsName = "warmstart"
	// staleMountAttempts bounds how many stacked dead mounts Mount detaches.
	staleMountAttempts = 16
)

// Sentinel errors callers branch on.
var (
	// ErrClosed is returned by Attach after Close.
	ErrClosed = errors.New("fuse memory device server closed")
	// ErrMountBusy means a live FUSE file system is already mounted at the
	// directory Mount was asked to use.
	ErrMountBusy = errors.New("a live FUSE mount is already at the directory")
	// ErrInvalidKey rejects a key that cannot be part of a file name.
	ErrInvalidKey = errors.New("invalid device key")
	// ErrInvalidIOEngine rejects an io_engine other than 0, 1 or 2.
	ErrInvalidIOEngine = errors.New("invalid io_engine")
	// ErrAttachConflict means a key is attached with a different lower
	// or io_engine than the generation that holds it (memdev.ErrConflict).
	ErrAttachConflict = memdev.ErrConflict
	// ErrNotAttached is returned by Share when the generation is no longer
	// the key's attached one.
	ErrNotAttached = errors.New("device generation not attached")
)

// Options configure a Server.
type Options struct {
	// MaxReadBytes is the largest read request the kernel may send. Zero
	// means DefaultMaxReadBytes; the kernel caps it at max_pages_limit pages.
	MaxReadBytes int
	// ReadAheadBytes is the kernel readahead (and mmap readaround) window of
	// the mount. Zero means DefaultReadAheadBytes. Windows above 128 KiB
	// are set through /sys/class/bdi after mounting.
	ReadAheadBytes int
	// AllowWriteOpen accepts opens of device files for writing, which
	// QEMU 7.2's memory-backend-file makes even with share=off before it
	// maps the file MAP_PRIVATE. Without it the mount is read-only and such
	// opens fail with EROFS. Either way the file is never written: write(2)
	// and truncation fail with EROFS, and private mappings copy on write.
	// A writable MAP_SHARED mapping would modify the page cache every
	// consumer shares; no consumer may make one.
	AllowWriteOpen bool
	// MissFillBytes, above the mount's readaround window, is the window
	// around a guest's demand read on a local lower that the device
	// brings into the page cache once it has answered the read: the
	// prefetching mount's one-page window keeps each fault exact for the
	// accounting, and this fill gives a guest that misses its manifest
	// the neighbours a wide window would have read, the pages after the
	// read first, and more ahead along a run of misses (missfill.go).
	// Zero fills nothing (the recorder's mount, whose trace needs every
	// touch).
	MissFillBytes int
	// Passthrough opens device files of local lowers (memdev.File) in
	// FUSE passthrough mode: the kernel reads the lower file itself for
	// read(2) and mmap, so no block is checked against the digest table
	// before the guest sees it, the device sees no fault, and a fill is
	// readahead of the lower file (passthrough.go). Off by default; other
	// lowers, and io_engine 2, are served as without it.
	Passthrough bool
	// ReadHook, if set, is called in the read handler of every request,
	// after it counts as in flight and before the lower file is read. A
	// test blocks in it to hold a read inside the server.
	ReadHook func(gen uint64, off int64, n int)
	// Debug logs every FUSE request, at DEBUG, to Log.
	Debug bool
	// Log receives the FUSE library's messages (see libraryLogger); nil
	// means slog.Default().
	Log *slog.Logger
}

// Server is one FUSE mount holding the device files of attached generations.
type Server struct {
	dir  string
	opts Options
	fuse *fuse.Server
	root *rootNode
	// readAheadBytes is the window the kernel reported after mounting.
	readAheadBytes int

	mu     sync.Mutex
	byKey  map[string]*generation
	byName map[string]*generation
	closed bool

	closeOnce sync.Once
	closeErr  error
}

// Mount mounts a new device server at dir, creating dir if needed and first
// detaching any dead FUSE mount a crashed earlier run left there.
func Mount(dir string, opts Options) (*Server, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("fuse device mount %s: %w", dir, err)
	}
	if opts.MaxReadBytes <= 0 {
		opts.MaxReadBytes = DefaultMaxReadBytes
	}
	if opts.ReadAheadBytes <= 0 {
		opts.ReadAheadBytes = DefaultReadAheadBytes
	}
	if err := cleanStaleMounts(abs); err != nil {
		return nil, fmt.Errorf("fuse device mount %s: %w", abs, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("fuse device mount %s: %w", abs, err)
	}

	s := &Server{
		dir:    abs,
		opts:   opts,
		byKey:  make(map[string]*generation),
		byName: make(map[string]*generation),
	}
	s.root = &rootNode{srv: s}
	fsOpts := mountOptions(opts)

	// go-fuse opens /dev/fuse without O_CLOEXEC on the direct-mount path.
	// A VMM child that inherited it would keep a dead daemon's mount
	// connected (hanging instead of failing with ENOTCONN), so forks wait
	// until every /dev/fuse descriptor is marked close-on-exec.
	syscall.ForkLock.RLock()
	srv, err := fs.Mount(abs, s.root, fsOpts)
	cloexecErr := closeOnExecFuseFds()
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, mountError(abs, err)
	}
	s.fuse = srv
	if cloexecErr != nil {
		s.Close()
		return nil, fmt.Errorf("fuse device mount %s: %w", abs, cloexecErr)
	}
	if opts.ReadAheadBytes > kernelReadAheadLimitBytes {
		if err := setReadAhead(abs, opts.ReadAheadBytes); err != nil {
			s.Close()
			return nil, fmt.Errorf("fuse device mount %s: %w", abs, err)
		}
	}
	if ra, err := readAhead(abs); err == nil {
		s.readAheadBytes = ra
	}
	return s, nil
}

// mountOptions are go-fuse's options for a mount with opts.
func mountOptions(opts Options) *fs.Options {
	mountFlags := uintptr(syscall.MS_NOSUID | syscall.MS_NODEV)
	if !opts.AllowWriteOpen {
		// The VFS then refuses writable opens itself, while a writable
		// MAP_PRIVATE mapping of a read-only descriptor still works.
		mountFlags |= syscall.MS_RDONLY
	}
	timeout := cacheTimeout
	var noNegative time.Duration
	return &fs.Options{
		MountOptions: fuse.MountOptions{
			FsName:            fsName,
			Name:              fsName,
			DirectMountStrict: true,
			DirectMountFlags:  mountFlags,
			MaxWrite:          opts.MaxReadBytes,
			MaxReadAhead:      min(opts.ReadAheadBytes, kernelReadAheadLimitBytes),
			MaxBackground:     maxBackgroundRequests,
			DisableXAttrs:     true,
			// Replies are copied from request buffers; go-fuse's splice
			// path only pays off for file-descriptor results.
			DisableSplice:            true,
			ExplicitDataCacheControl: true,
			Debug:                    opts.Debug,
			Logger:                   libraryLogger(opts.Log),
		},
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &noNegative,
		// Device files take inode numbers from their generation numbers
		// (generation.ino); keep go-fuse's own numbers clear of them.
		FirstAutomaticIno: 1 << 62,
	}
}

// Dir is the mount point.
func (s *Server) Dir() string { return s.dir }

// ReadAheadBytes is the readahead window the kernel reports for the mount,
// or 0 if it could not be read.
func (s *Server) ReadAheadBytes() int { return s.readAheadBytes }

// Close unmounts the file system. If a process still has a device file
// mapped or open, the mount is detached lazily: it disappears from the
// namespace at once, and the server keeps answering that process's reads
// until it lets go. Once unmounted, Close waits at most closeWait for the
// requests still being served; one blocked in a read of storage that
// stopped answering is left to finish by itself (the lowers are closed
// after it returns), and Close says so. Close is safe to call more than
// once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.closeErr = s.unmount()
	})
	return s.closeErr
}

func (s *Server) unmount() error {
	if s.fuse == nil {
		return nil
	}
	lazy := false
	err := unix.Unmount(s.dir, 0)
	switch {
	case errors.Is(err, unix.EBUSY):
		lazy = true
		err = unix.Unmount(s.dir, unix.MNT_DETACH)
	case errors.Is(err, unix.EINVAL):
		// Someone detached it already; files may still be open through it.
		lazy, err = true, nil
	}
	if err != nil {
		return fmt.Errorf("fuse device unmount %s: %w", s.dir, err)
	}
	finish := func() {
		s.fuse.Wait()
		s.mu.Lock()
		gens := make([]*generation, 0, len(s.byKey))
		for _, g := range s.byKey {
			gens = append(gens, g)
		}
		s.mu.Unlock()
		for _, g := range gens {
			g.closeLower()
		}
	}
	if lazy {
		go finish()
		return nil
	}
	finished := make(chan struct{})
	go func() {
		finish()
		close(finished)
	}()
	select {
	case <-finished:
		return nil
	case <-time.After(closeWait):
		// A handler blocked in a read of storage that stopped answering
		// cannot be interrupted, and nothing of the mount is left to
		// wait for: the server's end is left to finish when it returns.
		return fmt.Errorf("fuse device %s unmounted, but a handler is still in a read of the memory source after %v; it ends when the read returns", s.dir, closeWait)
	}
}

// defaultCloseWait is how long Close waits for a read still in progress
// (memdev.StuckReadWait).
const defaultCloseWait = memdev.StuckReadWait

// closeWait is defaultCloseWait; tests shorten it.
var closeWait = defaultCloseWait

// CleanStale detaches the dead FUSE mounts (of any FUSE file system) at dir
// and below it, deepest first: what a server that died without unmounting
// leaves behind. It returns nil only if nothing is mounted at or below dir
// afterwards, so that dir is safe to remove: a live FUSE mount there is
// ErrMountBusy, and any other mount is left alone and reported.
func CleanStale(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("clean stale mounts under %s: %w", dir, err)
	}
	points, err := mountPointsUnder(abs)
	if err != nil {
		return fmt.Errorf("clean stale mounts under %s: %w", abs, err)
	}
	// A deeper mount point is longer; detach it before what it sits in.
	slices.SortFunc(points, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, p := range points {
		if err := cleanStaleMounts(p); err != nil {
			return err
		}
	}
	if points, err = mountPointsUnder(abs); err != nil {
		return fmt.Errorf("clean stale mounts under %s: %w", abs, err)
	}
	if len(points) > 0 {
		return fmt.Errorf("clean stale mounts under %s: other file systems stay mounted at %s", abs, strings.Join(points, ", "))
	}
	return nil
}

// mountPointsUnder lists the distinct mount points at dir or below it.
func mountPointsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	seen := make(map[string]bool)
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountPath(fields[4])
		if (p == dir || strings.HasPrefix(p, dir+"/")) && !seen[p] {
			seen[p] = true
			points = append(points, p)
		}
	}
	return points, sc.Err()
}

// cleanStaleMounts detaches dead FUSE mounts stacked at dir. A mount whose
// server died answers every request with ENOTCONN; statfs always asks the
// server, unlike stat, which the kernel may answer from cached attributes.
// A mount that does not answer within ProbeTimeout is left alone
// (ErrMountUnresponsive): it may belong to a stopped, not a dead, server.
func cleanStaleMounts(dir string) error {
	for range staleMountAttempts {
		fstype, mounted, err := mountTypeAt(dir)
		if err != nil {
			return err
		}
		if !mounted || !strings.HasPrefix(fstype, "fuse") {
			return nil
		}
		err = statfsWithin(dir)
		switch {
		case errors.Is(err, ErrMountUnresponsive):
			return err
		case err == nil:
			return fmt.Errorf("%w: %s (%s)", ErrMountBusy, dir, fstype)
		case errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED):
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("detach stale mount at %s: %w", dir, err)
			}
		default:
			return fmt.Errorf("probe mount at %s: %w", dir, err)
		}
	}
	return fmt.Errorf("stale mounts at %s: still present after %d detaches", dir, staleMountAttempts)
}

// mountTypeAt reports the file system type of the topmost mount at dir.
func mountTypeAt(dir string) (fstype string, mounted bool, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || unescapeMountPath(fields[4]) != dir {
			continue
		}
		for i := 5; i < len(fields)-1; i++ {
			if fields[i] == "-" {
				// Later lines are mounted on top of earlier ones.
				fstype, mounted = fields[i+1], true
				break
			}
		}
	}
	return fstype, mounted, sc.Err()
}

// unescapeMountPath undoes the octal escapes mountinfo uses for blanks.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// closeOnExecFuseFds marks every open /dev/fuse descriptor close-on-exec.
func closeOnExecFuseFds() error {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list descriptors: %w", err)
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || target != "/dev/fuse" {
			continue
		}
		syscall.CloseOnExec(fd)
	}
	return nil
}

// bdiReadAheadPath is the sysfs knob of the backing device of the mount at dir.
func bdiReadAheadPath(dir string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)), nil
}

func setReadAhead(dir string, bytes int) error {
	p, err := bdiReadAheadPath(dir)
	if err != nil {
		return fmt.Errorf("set readahead: %w", err)
	}
	if err := os.WriteFile(p, []byte(strconv.Itoa(bytes>>10)), 0); err != nil {
		return fmt.Errorf("set readahead: %w", err)
	}
	return nil
}

func readAhead(dir string) (int, error) {
	p, err := bdiReadAheadPath(dir)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	kb, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, err
	}
	return kb << 10, nil
}

// mountError is the error of a FUSE mount at dir that failed with err: a
// refusal for want of privilege says what the mount needs.
func mountError(dir string, err error) error {
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("fuse device mount %s: %w (mounting FUSE needs root, or CAP_SYS_ADMIN)", dir, err)
	}
	return fmt.Errorf("fuse device mount %s: %w", dir, err)
}
