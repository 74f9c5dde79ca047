package uffd

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
	"warmstart/internal/reexec"
	"warmstart/internal/userfaultfd"
	"warmstart/internal/vmm/replay"
)

// In role roleVMM the test binary runs as a stand-in VMM, configured by
// childEnv, instead of running tests: a separate process, so that its page
// faults are served by the parent for real.
const (
	roleVMM  = "test-uffd-vmm"
	childEnv = "WARMSTART_UFFD_TEST_VMM"
)

// guardTimeout fails a test that would otherwise hang; it never paces one.
const guardTimeout = 30 * time.Second

func TestMain(m *testing.M) {
	reexec.Roles{
		roleVMM:              func() int { runChild(os.Getenv(childEnv)); return 0 },
		replay.RoleReplayVMM: replay.ChildMain,
	}.Dispatch()
	os.Exit(m.Run())
}

// testRegion is a region of guest memory: a run of the lower file.
type testRegion struct {
	Offset int64 `json:"offset"`
	Size   int64 `json:"size"`
}

type childConfig struct {
	Socket  string       `json:"socket"`
	Regions []testRegion `json:"regions"`
}

// step touches one page. Mode "r" reads the page (its bytes are hashed),
// "w" writes a marker into its first 8 bytes without reading, "rw" does both.
type step struct {
	Off  int64  `json:"off"`
	Mode string `json:"mode"`
}

type childCmd struct {
	ID    int    `json:"id"`
	Op    string `json:"op"` // touch, madvise, exit
	Steps []step `json:"steps,omitempty"`
	Off   int64  `json:"off,omitempty"`
	Len   int64  `json:"len,omitempty"`
}

type childReply struct {
	ID   int    `json:"id"`
	Hash string `json:"hash,omitempty"`
	Err  string `json:"err,omitempty"`
}

// marker is what a write step stores at the start of the page at off.
func marker(off int64) uint64 { return uint64(off)*0x9E3779B97F4A7C15 | 1 }

// runChild is the VMM: it maps anonymous private regions as Firecracker
// does for its Uffd backend, hands them over, then runs commands from stdin,
// each on its own goroutine, answering on stdout.
func runChild(cfgJSON string) {
	// A goroutine blocked in a page fault cannot be stopped for a
	// collection; keep the runtime from needing to, and leave spare Ps.
	debug.SetGCPercent(-1)
	runtime.GOMAXPROCS(4)
	die := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "uffd test VMM: "+format+"\n", args...)
		os.Exit(2)
	}
	var cfg childConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		die("config: %v", err)
	}
	fd, err := userfaultfd.Open()
	if err != nil {
		die("%v", err)
	}
	mems := make([][]byte, len(cfg.Regions))
	var mappings []userfaultfd.Mapping
	for i, r := range cfg.Regions {
		b, err := unix.Mmap(-1, 0, int(r.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			die("mmap: %v", err)
		}
		mems[i] = b
		base := bufAddr(b)
		if err := userfaultfd.RegisterMissing(fd, base, uintptr(r.Size)); err != nil {
			die("%v", err)
		}
		mappings = append(mappings, userfaultfd.Mapping{BaseHostVirtAddr: uint64(base), Size: uint64(r.Size), Offset: uint64(r.Offset), PageSize: userfaultfd.PageSizeBytes})
	}
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: cfg.Socket, Net: "unix"})
	if err != nil {
		die("connect: %v", err)
	}
	if err := userfaultfd.SendHandshake(conn, mappings, fd); err != nil {
		die("%v", err)
	}
	// The userfaultfd stays open (as in Firecracker); the socket need not.
	conn.Close()

	span := func(off, length int64) []byte {
		for i, r := range cfg.Regions {
			if off >= r.Offset && off+length <= r.Offset+r.Size {
				return mems[i][off-r.Offset : off-r.Offset+length]
			}
		}
		die("[%d, +%d) not mapped", off, length)
		return nil
	}
	var outMu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	reply := func(r childReply) {
		outMu.Lock()
		defer outMu.Unlock()
		if err := out.Encode(r); err != nil {
			die("reply: %v", err)
		}
	}
	reply(childReply{ID: 0})

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		var c childCmd
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			die("command: %v", err)
		}
		go func() {
			switch c.Op {
			case "touch":
				h := sha256.New()
				tmp := make([]byte, userfaultfd.PageSizeBytes)
				for _, s := range c.Steps {
					p := span(s.Off, userfaultfd.PageSizeBytes)
					if s.Mode != "w" {
						copy(tmp, p)
						h.Write(tmp)
					}
					if s.Mode != "r" {
						binary.LittleEndian.PutUint64(p, marker(s.Off))
					}
				}
				reply(childReply{ID: c.ID, Hash: hex.EncodeToString(h.Sum(nil))})
			case "madvise":
				if err := unix.Madvise(span(c.Off, c.Len), unix.MADV_DONTNEED); err != nil {
					reply(childReply{ID: c.ID, Err: err.Error()})
					return
				}
				reply(childReply{ID: c.ID})
			case "exit":
				os.Exit(0)
			default:
				die("unknown op %q", c.Op)
			}
		}()
	}
	// Stdin closed: the parent is gone.
	os.Exit(0)
}

// childVMM is the parent's handle on a VMM child.
type childVMM struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{} // closed when the child's stdout ends

	mu      sync.Mutex
	nextID  int
	waiters map[int]chan childReply
}

// startVMM starts a VMM child that maps regions and hands them to the
// handler listening on socket. It returns once the handshake is sent.
func startVMM(t testing.TB, socket string, regions []testRegion) *childVMM {
	t.Helper()
	cfg, err := json.Marshal(childConfig{Socket: socket, Regions: regions})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// No asynchronous preemption signals: a signal interrupting a fault
	// makes the thread fault again, which would blur exact fault counts.
	// The race runtime otherwise lingers a second in os.Exit.
	cmd.Env = append(reexec.Environ(os.Environ(), roleVMM), childEnv+"="+string(cfg), "GODEBUG=asyncpreemptoff=1", "GORACE=atexit_sleep_ms=0")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	v := &childVMM{t: t, cmd: cmd, stdin: stdin, exited: make(chan struct{}), nextID: 1, waiters: map[int]chan childReply{0: make(chan childReply, 1)}}
	ready := v.waiters[0]
	go func() {
		defer close(v.exited)
		dec := json.NewDecoder(stdout)
		for {
			var r childReply
			if err := dec.Decode(&r); err != nil {
				return
			}
			v.mu.Lock()
			ch := v.waiters[r.ID]
			delete(v.waiters, r.ID)
			v.mu.Unlock()
			if ch != nil {
				ch <- r
			}
		}
	}()
	t.Cleanup(v.kill)
	select {
	case <-ready:
	case <-v.exited:
		t.Fatal("VMM child exited before its handshake")
	case <-time.After(guardTimeout):
		t.Fatal("VMM child did not start")
	}
	return v
}

// kill ends the child; a child blocked in a fault no handler serves dies
// only this way.
func (v *childVMM) kill() {
	v.cmd.Process.Kill()
	v.cmd.Wait()
}

// send issues a command and returns where its reply will arrive.
func (v *childVMM) send(c childCmd) <-chan childReply {
	v.t.Helper()
	ch := make(chan childReply, 1)
	v.mu.Lock()
	c.ID = v.nextID
	v.nextID++
	v.waiters[c.ID] = ch
	v.mu.Unlock()
	line, err := json.Marshal(c)
	if err != nil {
		v.t.Fatal(err)
	}
	if _, err := v.stdin.Write(append(line, '\n')); err != nil {
		v.t.Fatalf("send %s: %v", c.Op, err)
	}
	return ch
}

// wait returns the reply on ch, failing if the child dies first.
func (v *childVMM) wait(ch <-chan childReply) childReply {
	v.t.Helper()
	select {
	case r := <-ch:
		if r.Err != "" {
			v.t.Fatalf("VMM child: %s", r.Err)
		}
		return r
	case <-v.exited:
		v.t.Fatal("VMM child exited")
	case <-time.After(guardTimeout):
		v.t.Fatal("VMM child did not answer")
	}
	return childReply{}
}

func (v *childVMM) touch(steps ...step) string {
	v.t.Helper()
	return v.wait(v.send(childCmd{Op: "touch", Steps: steps})).Hash
}

func (v *childVMM) madvise(off, length int64) {
	v.t.Helper()
	v.wait(v.send(childCmd{Op: "madvise", Off: off, Len: length}))
}

// await receives from ch, failing the test if nothing arrives.
func await[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(guardTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// model is what the guest memory must hold: the lower file, with the
// writes and discards the test has made.
type model struct{ mem []byte }

func (m *model) touch(steps ...step) string {
	h := sha256.New()
	for _, s := range steps {
		p := m.mem[s.Off : s.Off+userfaultfd.PageSizeBytes]
		if s.Mode != "w" {
			h.Write(p)
		}
		if s.Mode != "r" {
			binary.LittleEndian.PutUint64(p, marker(s.Off))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (m *model) remove(off, length int64) { clear(m.mem[off : off+length]) }

// fixture is a handler on a fresh lower file, a VMM child, and its session.
type fixture struct {
	t         testing.TB
	dir       string
	socket    string
	lowerPath string
	lower     []byte
	model     *model
	regions   []testRegion
	h         *Handler
	s         *Session
	v         *childVMM
}

// twoRegions is a 4 MiB memory file with two mapped regions and a hole.
var twoRegions = []testRegion{{Offset: 0, Size: 1 << 20}, {Offset: 2 << 20, Size: 2 << 20}}

const lowerBytes = 4 << 20

// newLowerFile writes random bytes with every seventh page zero, as guests
// leave many pages untouched.
func newLowerFile(t testing.TB, dir string, size int) (string, []byte) {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	for off := 0; off < size; off += 7 * userfaultfd.PageSizeBytes {
		clear(data[off : off+userfaultfd.PageSizeBytes])
	}
	path := filepath.Join(dir, "memory")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, data
}

// openLower opens the memory file at path as a device does.
func openLower(t testing.TB, path string) memdev.Lower {
	t.Helper()
	l, err := memdev.File(path).Open()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// newHandler listens on a fresh socket for a fresh lower file of
// lowerBytes mapped as twoRegions.
func newHandler(t testing.TB, opts Options) *fixture {
	t.Helper()
	return newHandlerFor(t, opts, lowerBytes, twoRegions)
}

func newHandlerFor(t testing.TB, opts Options, size int, regions []testRegion) *fixture {
	t.Helper()
	// Socket paths are limited to 108 bytes; test temp dirs can be longer.
	dir, err := os.MkdirTemp("", "uffd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fixture{t: t, dir: dir, socket: filepath.Join(dir, "uffd.sock"), regions: regions}
	f.lowerPath, f.lower = newLowerFile(t, dir, size)
	f.model = &model{mem: append([]byte(nil), f.lower...)}
	f.h, err = Listen(f.socket, openLower(t, f.lowerPath), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.h.Close() })
	return f
}

// connect starts a VMM child and accepts its session.
func (f *fixture) connect(regions []testRegion) (*childVMM, *Session) {
	f.t.Helper()
	type result struct {
		s   *Session
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := f.h.Accept(context.Background())
		ch <- result{s, err}
	}()
	v := startVMM(f.t, f.socket, regions)
	r := await(f.t, ch, "accept")
	if r.err != nil {
		f.t.Fatalf("accept: %v", r.err)
	}
	f.t.Cleanup(func() { r.s.Close() })
	return v, r.s
}

// newFixture is a handler with one connected VMM child over twoRegions.
func newFixture(t testing.TB, opts Options) *fixture {
	t.Helper()
	f := newHandler(t, opts)
	f.v, f.s = f.connect(f.regions)
	return f
}

// pages lists the page offsets of the fixture's regions.
func (f *fixture) pages() []int64 {
	var out []int64
	for _, r := range f.regions {
		for off := r.Offset; off < r.End(); off += userfaultfd.PageSizeBytes {
			out = append(out, off)
		}
	}
	return out
}

func (r testRegion) End() int64 { return r.Offset + r.Size }

// touchAndCheck runs steps in the child and compares its hash with the model.
func (f *fixture) touchAndCheck(steps ...step) {
	f.t.Helper()
	want := f.model.touch(steps...)
	if got := f.v.touch(steps...); got != want {
		f.t.Fatalf("VMM read hash %s, want %s", got, want)
	}
}

func reads(offs ...int64) []step {
	out := make([]step, len(offs))
	for i, o := range offs {
		out[i] = step{Off: o, Mode: "r"}
	}
	return out
}
