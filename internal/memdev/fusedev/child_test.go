package fusedev

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
	"warmstart/internal/reexec"
	"warmstart/internal/vmm/replay"
)

// The test binary doubles as the consumer process: in role roleConsumer,
// TestMain runs the childSpec in childSpecEnv and exits. Consumers must be
// other processes, because faulting on memory this process serves would
// deadlock it.
const (
	roleConsumer = "test-fusedev-consumer"
	childSpecEnv = "FUSEDEV_TEST_CHILD"
)

// childPauseLine is printed by a child that waits for a line on stdin.
const childPauseLine = "PAUSED"

// Child modes.
const (
	// childMmap maps each region of Layout MAP_PRIVATE (Shared: MAP_SHARED)
	// and reads each page of Pages from the mapping.
	childMmap = "mmap"
	// childRead preads ReadBytes at each offset of Pages.
	childRead = "read"
	// childWrite opens Path for writing and pwrites one byte at Pages[0].
	childWrite = "write"
	// childMount mounts a Server at Dir and waits to be killed.
	childMount = "mount"
	// childMountOpen mounts a Server at Dir, attaches Path, opens its own
	// device file at a descriptor below its FUSE connection's (as a
	// restore's prefetch may, once a lower descriptor was freed) and
	// waits to be killed.
	childMountOpen = "mount-open"
)

type childSpec struct {
	Mode   string        `json:"mode"`
	Path   string        `json:"path,omitempty"`
	Layout layout.Layout `json:"layout"`
	Shared bool          `json:"shared,omitempty"`
	// ReadWrite opens Path O_RDWR, as QEMU 7.2 does before mapping it
	// MAP_PRIVATE; Write then also writes each touched page through the
	// mapping after reading it.
	ReadWrite bool    `json:"read_write,omitempty"`
	Write     bool    `json:"write,omitempty"`
	Pages     []int64 `json:"pages,omitempty"`
	// ReadBytes is the pread size in childRead mode; 0 means one page.
	ReadBytes int `json:"read_bytes,omitempty"`
	// With Pause set, the child prints childPauseLine before reading
	// Pages[PauseAt] and waits for a line on stdin.
	Pause   bool   `json:"pause,omitempty"`
	PauseAt int    `json:"pause_at,omitempty"`
	Dir     string `json:"dir,omitempty"`
}

type childResult struct {
	// Hash is the SHA-256 of the bytes read, in order.
	Hash string `json:"hash"`
	// Touched is how many entries of Pages were read.
	Touched int `json:"touched"`
	// Err describes the failure that stopped the child, if any.
	Err string `json:"err,omitempty"`
	// Fault is set when the failure was a fault on the mapping (SIGBUS).
	Fault bool `json:"fault,omitempty"`
	// Errno is the errno of a failed system call.
	Errno int `json:"errno,omitempty"`
}

func TestMain(m *testing.M) {
	reexec.Roles{
		roleConsumer:         func() int { return runChild(os.Getenv(childSpecEnv)) },
		replay.RoleReplayVMM: replay.ChildMain,
	}.Dispatch()
	os.Exit(m.Run())
}

func runChild(raw string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "child spec:", err)
		return 2
	}
	var res childResult
	switch spec.Mode {
	case childMmap:
		res = childTouchMapped(spec)
	case childRead:
		res = childTouchRead(spec)
	case childWrite:
		res = childPwrite(spec)
	case childMountOpen:
		return childServeOwnOpen(spec)
	case childMount:
		srv, err := Mount(spec.Dir, Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "child mount:", err)
			return 2
		}
		_ = srv
		fmt.Println(childPauseLine)
		select {} // until killed: leave the mount behind as a crash would
	default:
		fmt.Fprintln(os.Stderr, "child mode:", spec.Mode)
		return 2
	}
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	return 0
}

func childPause(spec childSpec, i int, stdin *bufio.Reader) {
	if spec.Pause && i == spec.PauseAt {
		fmt.Println(childPauseLine)
		stdin.ReadString('\n')
	}
}

func failWith(res *childResult, err error) {
	res.Err = err.Error()
	var errno unix.Errno
	if errors.As(err, &errno) {
		res.Errno = int(errno)
	}
}

func childPwrite(spec childSpec) (res childResult) {
	f, err := os.OpenFile(spec.Path, os.O_RDWR, 0)
	if err != nil {
		failWith(&res, err)
		return res
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{1}, spec.Pages[0]); err != nil {
		failWith(&res, err)
	}
	return res
}

func childTouchMapped(spec childSpec) (res childResult) {
	mode := os.O_RDONLY
	if spec.ReadWrite {
		mode = os.O_RDWR
	}
	f, err := os.OpenFile(spec.Path, mode, 0)
	if err != nil {
		failWith(&res, err)
		return res
	}
	defer f.Close()
	flags := unix.MAP_PRIVATE
	if spec.Shared {
		flags = unix.MAP_SHARED
	}
	maps := make([][]byte, len(spec.Layout.Regions))
	for i, r := range spec.Layout.Regions {
		// Firecracker maps guest memory writable even from a read-only fd.
		prot := unix.PROT_READ | unix.PROT_WRITE
		if spec.Shared && !spec.ReadWrite {
			prot = unix.PROT_READ
		}
		m, err := unix.Mmap(int(f.Fd()), r.Offset, int(r.Size), prot, flags)
		if err != nil {
			failWith(&res, fmt.Errorf("mmap region %d: %w", i, err))
			return res
		}
		maps[i] = m
	}
	h := sha256.New()
	stdin := bufio.NewReader(os.Stdin)
	page := make([]byte, layout.DefaultPageSize)
	debug.SetPanicOnFault(true)
	defer func() {
		if r := recover(); r != nil {
			res.Fault = true
			res.Err = fmt.Sprint(r)
		}
		res.Hash = hex.EncodeToString(h.Sum(nil))
	}()
	for i, off := range spec.Pages {
		childPause(spec, i, stdin)
		ri, ok := spec.Layout.RegionAt(off)
		if !ok {
			res.Err = fmt.Sprintf("page %d outside the layout", off)
			return res
		}
		rel := off - spec.Layout.Regions[ri].Offset
		mem := maps[ri][rel : rel+int64(len(page))]
		copy(page, mem)
		h.Write(page)
		if spec.Write {
			mem[0] ^= 0xff
			if mem[0] == page[0] {
				res.Err = fmt.Sprintf("write to page %d did not stick", off)
				return res
			}
		}
		res.Touched++
	}
	return res
}

func childTouchRead(spec childSpec) (res childResult) {
	f, err := os.Open(spec.Path)
	if err != nil {
		failWith(&res, err)
		return res
	}
	defer f.Close()
	n := spec.ReadBytes
	if n == 0 {
		n = layout.DefaultPageSize
	}
	buf := make([]byte, n)
	h := sha256.New()
	stdin := bufio.NewReader(os.Stdin)
	defer func() { res.Hash = hex.EncodeToString(h.Sum(nil)) }()
	for i, off := range spec.Pages {
		childPause(spec, i, stdin)
		got, err := f.ReadAt(buf, off)
		if err != nil && !(errors.Is(err, io.EOF) && got > 0) {
			failWith(&res, err)
			return res
		}
		h.Write(buf[:got])
		res.Touched++
	}
	return res
}

// child is a running consumer process.
type child struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr strings.Builder
}

func startChild(t *testing.T, spec childSpec) *child {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, cmd: exec.Command(os.Args[0], "-test.run=^$")}
	// The race detector otherwise sleeps a second at every child's exit.
	c.cmd.Env = append(reexec.Environ(os.Environ(), roleConsumer), childSpecEnv+"="+string(raw),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	c.cmd.Stderr = &c.stderr
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.stdout = bufio.NewReader(out)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	return c
}

// waitPaused blocks until the child prints childPauseLine.
func (c *child) waitPaused() {
	c.t.Helper()
	line, err := c.stdout.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != childPauseLine {
		c.t.Fatalf("child did not pause: %q, %v; stderr: %s", line, err, c.stderr.String())
	}
}

func (c *child) resume() {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		c.t.Fatalf("resume child: %v", err)
	}
}

// result waits for the child to exit and returns what it reported.
func (c *child) result() childResult {
	c.t.Helper()
	rest, _ := io.ReadAll(c.stdout)
	err := c.cmd.Wait()
	if err != nil {
		c.t.Fatalf("child: %v; stderr: %s", err, c.stderr.String())
	}
	var res childResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(rest))), &res); err != nil {
		c.t.Fatalf("child output %q: %v; stderr: %s", rest, err, c.stderr.String())
	}
	return res
}

func runChildSpec(t *testing.T, spec childSpec) childResult {
	t.Helper()
	return startChild(t, spec).result()
}

// resultTimeout bounds waits that only fail when the code under test is broken.
const resultTimeout = 30 * time.Second

// childServeOwnOpen is childMountOpen: a server holding its own device
// file open below its /dev/fuse descriptor, so that an exit closes the
// device file while the connection is still alive.
func childServeOwnOpen(spec childSpec) int {
	fail := func(what string, err error) int {
		fmt.Fprintln(os.Stderr, "child", what+":", err)
		return 2
	}
	low, err := os.Open(os.DevNull) // a descriptor number to free later
	if err != nil {
		return fail("reserve", err)
	}
	srv, err := Mount(spec.Dir, Options{})
	if err != nil {
		return fail("mount", err)
	}
	d, err := srv.Attach("own", fileReq(spec.Path, memdev.IOEngineBuffered))
	if err != nil {
		return fail("attach", err)
	}
	low.Close()
	f, err := os.Open(d.Path())
	if err != nil {
		return fail("open own device file", err)
	}
	if fuse := fuseDescriptors(); len(fuse) == 0 || int(f.Fd()) > fuse[0] {
		return fail("descriptors", fmt.Errorf("device file at %d, /dev/fuse at %v: want the device file first", f.Fd(), fuse))
	}
	fmt.Println(childPauseLine)
	select {} // until killed, with the device file open
}

// fuseDescriptors are this process's /dev/fuse descriptors, ascending.
func fuseDescriptors() []int {
	entries, _ := os.ReadDir("/proc/self/fd")
	var fds []int
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == "/dev/fuse" {
			fds = append(fds, fd)
		}
	}
	slices.Sort(fds)
	return fds
}
