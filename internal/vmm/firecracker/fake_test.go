package firecracker

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev/uffd"
	"warmstart/internal/role"
)

// In role roleFake the test binary acts as a fake Firecracker configured
// by the fakeConfig file fakeEnv names.
const (
	roleFake = "test-fake-firecracker"
	fakeEnv  = "WARMSTART_FAKE_FIRECRACKER"
)

func TestMain(m *testing.M) {
	role.Roles{roleFake: func() int { return runFakeFirecracker(os.Getenv(fakeEnv), os.Args[1:]) }}.Dispatch()
	os.Exit(m.Run())
}

// fakeConfig steers a fake Firecracker.
type fakeConfig struct {
	// DieOnStart makes it log an error and exit 1 before binding the socket.
	DieOnStart bool
	// NoSocket makes it run without ever binding the API socket.
	NoSocket bool
	// IgnoreCtrlAltDel makes it answer SendCtrlAltDel and keep running.
	IgnoreCtrlAltDel bool
	// HangLoad makes PUT /snapshot/load block until the client goes away,
	// after connecting to a Uffd handler.
	HangLoad bool
	// Agent makes it serve GET /health on <runtime dir>/agent.sock while
	// the VM runs, as the guest agent would.
	Agent bool
	// RecordPath, when set, receives one JSON line per API request.
	RecordPath string
	// TouchPages makes the fake play a guest with a working set: after a
	// snapshot load, once the VM runs, it reads these page offsets of
	// guest memory in order, and only then does its agent answer. Memory
	// is mapped as Firecracker maps it: the File backend MAP_PRIVATE, the
	// Uffd backend anonymous, registered with a userfaultfd that is handed
	// to the handler over the backend socket. A boot draws a token; a
	// snapshot create writes each page's offset and the token at the start
	// of each of these pages; a restored guest checks every offset it
	// reads and its agent answers with the token it found.
	TouchPages []int64
}

// recordedRequest is one API request a fake received.
type recordedRequest struct {
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Body   json.RawMessage `json:"body,omitempty"`
}

// fakeBinary writes a stand-in executable that runs this test binary as a
// fake Firecracker with cfg, and returns its path.
func fakeBinary(t *testing.T, cfg fakeConfig) string {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "fake.json")
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The race detector otherwise lingers a second at exit, which would
	// stretch every stop.
	script := fmt.Sprintf("#!/bin/sh\nGORACE=\"${GORACE:+$GORACE }atexit_sleep_ms=0\" %s=%s %s=%s exec %s \"$@\"\n",
		role.Env, roleFake, fakeEnv, shellQuote(cfgPath), shellQuote(exe))
	path := filepath.Join(dir, "firecracker")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// readRecords returns the requests fakes recorded at path.
func readRecords(t *testing.T, path string) []recordedRequest {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []recordedRequest
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line == "" {
			continue
		}
		var r recordedRequest
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

// runFakeFirecracker takes Firecracker's command line and serves its API
// the way Firecracker answers it, for process-level tests.
func runFakeFirecracker(cfgPath string, args []string) int {
	fs := flag.NewFlagSet("firecracker", flag.ContinueOnError)
	apiSock := fs.String("api-sock", "", "")
	id := fs.String("id", "", "")
	logPath := fs.String("log-path", "", "")
	level := fs.String("level", "", "")
	showLevel := fs.Bool("show-level", false, "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var cfg fakeConfig
	data, err := os.ReadFile(cfgPath)
	if err == nil {
		err = json.Unmarshal(data, &cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake firecracker: config:", err)
		return 2
	}
	// Like Firecracker, need the log file to exist.
	logFile, err := os.OpenFile(*logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake firecracker: log:", err)
		return 1
	}
	dir := filepath.Dir(*apiSock)
	_ = os.WriteFile(filepath.Join(dir, "fake.pid"), []byte(strconv.Itoa(os.Getpid())), 0o600)
	fmt.Fprintf(logFile, "[%s:INFO] fake firecracker running, level %s, show-level %v\n", *id, *level, *showLevel)
	if cfg.DieOnStart {
		fmt.Fprintf(logFile, "[%s:ERROR] refusing to start: kernel image is corrupt\n", *id)
		fmt.Fprintln(os.Stderr, "console: early panic")
		return 1
	}
	if cfg.NoSocket {
		select {}
	}
	l, err := net.Listen("unix", *apiSock)
	if err != nil {
		fmt.Fprintf(logFile, "[%s:ERROR] bind api socket: %v\n", *id, err)
		return 1
	}
	// Firecracker leaves its sockets behind; so does the fake.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if len(cfg.TouchPages) > 0 {
		// A goroutine blocked in a fault on guest memory would hold up
		// a collection's stop-the-world, and with it the API server.
		debug.SetGCPercent(-1)
	}
	vm := newFakeVM(cfg, *id, dir, logFile)
	srv := &http.Server{Handler: vm}
	go func() { _ = srv.Serve(l) }()
	<-vm.shutdown
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx) // lets the SendCtrlAltDel answer go out
	return 0
}

// fakeVM answers Firecracker's API: it tracks the VM's state, refuses
// what Firecracker refuses in that state, and writes snapshot files.
type fakeVM struct {
	cfg      fakeConfig
	id       string
	dir      string
	log      io.Writer
	shutdown chan struct{}

	mu         sync.Mutex
	state      string // "Not started", "Running", "Paused"
	configured bool
	machine    MachineConfig
	agent      net.Listener
	held       []io.Closer // uffd connections, vsock listeners
	records    []recordedRequest
	stopOnce   sync.Once
	// token is what the guest keeps in memory (TouchPages): drawn at
	// boot, or read back from memory by a restored guest.
	token string
	// mem is guest memory mapped by a snapshot load (TouchPages);
	// guestStart says the VM has just begun to run on it, and guestRan
	// that it has.
	mem        []byte
	guestStart bool
	guestRan   bool
}

func newFakeVM(cfg fakeConfig, id, dir string, log io.Writer) *fakeVM {
	return &fakeVM{
		cfg: cfg, id: id, dir: dir, log: log,
		shutdown: make(chan struct{}),
		state:    "Not started",
		machine:  MachineConfig{VCPUCount: 1, MemSizeMiB: 128},
	}
}

func (f *fakeVM) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.agent != nil {
		f.agent.Close()
	}
	for _, c := range f.held {
		c.Close()
	}
}

type fakeFault struct {
	status int
	msg    string
}

func (f *fakeVM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.record(recordedRequest{Method: r.Method, Path: r.URL.Path, Body: json.RawMessage(body)})
	fmt.Fprintf(f.log, "[%s:INFO] %s %s\n", f.id, r.Method, r.URL.Path)
	if f.cfg.HangLoad && r.URL.Path == "/snapshot/load" {
		var load SnapshotLoad
		_ = json.Unmarshal(body, &load)
		if conn, err := net.Dial("unix", load.MemBackend.BackendPath); err == nil {
			defer conn.Close()
		}
		<-r.Context().Done()
		return
	}
	f.mu.Lock()
	out, fault := f.handle(r.Method, r.URL.Path, body)
	start := f.guestStart
	f.guestStart = false
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case fault != nil:
		w.WriteHeader(fault.status)
		_ = json.NewEncoder(w).Encode(map[string]string{"fault_message": fault.msg})
	case out != nil:
		_ = json.NewEncoder(w).Encode(out)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
	if start {
		// The guest faults only once the answer is out, as Firecracker's
		// vCPUs run after the load returns: a Uffd handler accepts the
		// VM only after that.
		w.(http.Flusher).Flush()
		go f.runGuest()
	}
}

// recorded returns the requests received so far.
func (f *fakeVM) recorded() []recordedRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.records)
}

func (f *fakeVM) record(r recordedRequest) {
	if len(r.Body) == 0 {
		r.Body = nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records = append(f.records, r)
	if f.cfg.RecordPath == "" {
		return
	}
	line, _ := json.Marshal(r)
	file, err := os.OpenFile(f.cfg.RecordPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer file.Close()
	_, _ = file.Write(append(line, '\n'))
}

func badRequest(format string, args ...any) *fakeFault {
	return &fakeFault{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// handle runs one request with f.mu held. It returns a JSON answer, a
// fault, or neither (204).
func (f *fakeVM) handle(method, path string, body []byte) (any, *fakeFault) {
	preBoot := func() *fakeFault {
		if f.state != "Not started" {
			return badRequest("The requested operation is not supported after starting the microVM.")
		}
		f.configured = true
		return nil
	}
	switch {
	case method == http.MethodGet && path == "/":
		return InstanceInfo{AppName: "Firecracker", ID: f.id, State: f.state, VMMVersion: "fake"}, nil
	case method == http.MethodGet && path == "/machine-config":
		return f.machine, nil
	case method == http.MethodPut && path == "/machine-config":
		if err := json.Unmarshal(body, &f.machine); err != nil {
			return nil, badRequest("%v", err)
		}
		return nil, preBoot()
	case method == http.MethodPut && (path == "/boot-source" || strings.HasPrefix(path, "/drives/") || strings.HasPrefix(path, "/network-interfaces/")):
		return nil, preBoot()
	case method == http.MethodPut && path == "/vsock":
		var v Vsock
		if err := json.Unmarshal(body, &v); err != nil {
			return nil, badRequest("%v", err)
		}
		if fault := preBoot(); fault != nil {
			return nil, fault
		}
		return nil, f.bindVsock(v.UDSPath)
	case method == http.MethodPut && path == "/actions":
		return nil, f.action(body)
	case method == http.MethodPatch && path == "/vm":
		var v vmBody
		if err := json.Unmarshal(body, &v); err != nil {
			return nil, badRequest("%v", err)
		}
		if f.state == "Not started" {
			return nil, badRequest("The microVM is not running.")
		}
		if v.State == VMPaused {
			f.state = "Paused"
			return nil, nil
		}
		f.state = "Running"
		if f.mem != nil {
			f.guestStart = !f.guestRan
			f.guestRan = true
			return nil, nil
		}
		return nil, f.startAgent()
	case method == http.MethodPut && path == "/snapshot/create":
		return nil, f.createSnapshot(body)
	case method == http.MethodPut && path == "/snapshot/load":
		return nil, f.loadSnapshot(body)
	}
	return nil, &fakeFault{status: http.StatusBadRequest, msg: fmt.Sprintf("Invalid request method and/or path: %s %s.", method, path)}
}

func (f *fakeVM) action(body []byte) *fakeFault {
	var a actionBody
	if err := json.Unmarshal(body, &a); err != nil {
		return badRequest("%v", err)
	}
	switch a.ActionType {
	case ActionInstanceStart:
		if f.state != "Not started" {
			return badRequest("The microVM is already running.")
		}
		f.state = "Running"
		f.token = rand.Text()
		return f.startAgent()
	case ActionSendCtrlAltDel:
		if f.state != "Running" {
			return badRequest("SendCtrlAltDel needs a running microVM, it is %s.", f.state)
		}
		if !f.cfg.IgnoreCtrlAltDel {
			f.stopOnce.Do(func() { close(f.shutdown) })
		}
		return nil
	case ActionFlushMetrics:
		return nil
	}
	return badRequest("unknown action %q", a.ActionType)
}

func (f *fakeVM) createSnapshot(body []byte) *fakeFault {
	var c SnapshotCreate
	if err := json.Unmarshal(body, &c); err != nil {
		return badRequest("%v", err)
	}
	if f.state != "Paused" {
		return badRequest("Cannot create a snapshot: the microVM is not paused.")
	}
	state, _ := json.Marshal(f.machine)
	if err := os.WriteFile(c.SnapshotPath, state, 0o600); err != nil {
		return badRequest("%v", err)
	}
	mem, err := os.Create(c.MemFilePath)
	if err == nil {
		err = mem.Truncate(f.machine.MemSizeMiB << 20)
		for _, off := range f.cfg.TouchPages {
			if err == nil {
				_, err = mem.WriteAt(pageMarker(off, f.token), off)
			}
		}
		if cerr := mem.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return badRequest("%v", err)
	}
	return nil
}

// pageMarkerBytes is the length of a page marker: the offset, and a token
// as rand.Text draws it.
const pageMarkerBytes = 8 + 26

// pageMarker is what a snapshot holds at the start of a touched page.
func pageMarker(off int64, token string) []byte {
	return append(binary.LittleEndian.AppendUint64(nil, uint64(off)), token...)
}

func (f *fakeVM) loadSnapshot(body []byte) *fakeFault {
	var l SnapshotLoad
	if err := json.Unmarshal(body, &l); err != nil {
		return badRequest("%v", err)
	}
	if f.state != "Not started" || f.configured {
		return badRequest("Loading a microVM snapshot not allowed after configuring boot-specific resources.")
	}
	state, err := os.ReadFile(l.SnapshotPath)
	if err != nil {
		return badRequest("Cannot open snapshot file: %v", err)
	}
	if err := json.Unmarshal(state, &f.machine); err != nil {
		return badRequest("Cannot deserialize the microVM state: %v", err)
	}
	switch l.MemBackend.BackendType {
	case "File":
		st, err := os.Stat(l.MemBackend.BackendPath)
		if err != nil {
			return badRequest("Cannot open the memory file: %v", err)
		}
		if st.Size() != f.machine.MemSizeMiB<<20 {
			return badRequest("memory file is %d bytes, the snapshot has %d MiB", st.Size(), f.machine.MemSizeMiB)
		}
		if len(f.cfg.TouchPages) > 0 {
			if f.mem, err = mapFile(l.MemBackend.BackendPath, st.Size()); err != nil {
				return badRequest("Cannot map the memory file: %v", err)
			}
		}
	case "Uffd":
		if len(f.cfg.TouchPages) > 0 {
			mem, conn, err := mapUffd(l.MemBackend.BackendPath, f.machine.MemSizeMiB<<20)
			if err != nil {
				return badRequest("Cannot hand guest memory to the page-fault handler: %v", err)
			}
			f.mem = mem
			f.held = append(f.held, conn)
			break
		}
		conn, err := net.Dial("unix", l.MemBackend.BackendPath)
		if err != nil {
			return badRequest("Cannot connect to UDS in order to send information on handling guest memory page-faults due to: %v", err)
		}
		f.held = append(f.held, conn)
		regions, _ := json.Marshal([]map[string]int64{{"base_host_virt_addr": 0, "size": f.machine.MemSizeMiB << 20, "offset": 0, "page_size": 4096}})
		_, _ = conn.Write(regions)
	default:
		return badRequest("unknown backend %q", l.MemBackend.BackendType)
	}
	if l.VsockOverride != nil {
		if fault := f.bindVsock(l.VsockOverride.UDSPath); fault != nil {
			return fault
		}
	}
	if !l.ResumeVM {
		f.state = "Paused"
		return nil
	}
	f.state = "Running"
	if f.mem != nil {
		f.guestStart, f.guestRan = true, true
		return nil
	}
	return f.startAgent()
}

// mapFile maps a memory file as Firecracker's File backend does: opened
// read-only, mapped private and writable.
func mapFile(path string, size int64) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	return unix.Mmap(int(file.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_NORESERVE)
}

// mapUffd maps anonymous guest memory, registers it with a new
// userfaultfd and hands both to the handler listening at socket, as
// Firecracker's Uffd backend does. The connection keeps the handler's
// session; the descriptor stays open (and the ranges registered) for the
// life of the process.
func mapUffd(socket string, size int64) ([]byte, io.Closer, error) {
	fd, err := uffd.Open()
	if err != nil {
		return nil, nil, err
	}
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, nil, err
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	if err := uffd.RegisterMissing(fd, addr, uintptr(size)); err != nil {
		return nil, nil, err
	}
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	mappings := []uffd.Mapping{{BaseHostVirtAddr: uint64(addr), Size: uint64(size), PageSize: uffd.PageSizeBytes}}
	if err := uffd.SendHandshake(conn, mappings, fd); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return mem, conn, nil
}

// runGuest plays the restored guest: it reads its working set, checking
// that each page holds what the snapshot put there, and then lets its
// agent answer with the token it found. Memory that does not hold what
// was captured is a crash, as a real guest's would be.
func (f *fakeVM) runGuest() {
	f.mu.Lock()
	mem := f.mem
	f.mu.Unlock()
	token := ""
	for _, off := range f.cfg.TouchPages {
		page := mem[off : off+pageMarkerBytes]
		marker := binary.LittleEndian.Uint64(page)
		if marker != uint64(off) {
			fmt.Fprintf(f.log, "[%s:ERROR] guest memory at %d holds marker %d\n", f.id, off, marker)
			os.Exit(1)
		}
		if tok := string(page[8:]); token == "" {
			token = tok
		} else if tok != token {
			fmt.Fprintf(f.log, "[%s:ERROR] guest memory at %d holds token %q, earlier pages %q\n", f.id, off, tok, token)
			os.Exit(1)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.token = token
	if fault := f.startAgent(); fault != nil {
		fmt.Fprintf(f.log, "[%s:ERROR] %s\n", f.id, fault.msg)
	}
}

func (f *fakeVM) bindVsock(path string) *fakeFault {
	l, err := net.Listen("unix", path)
	if err != nil {
		return badRequest("vsock: %v", err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	f.held = append(f.held, l)
	return nil
}

// startAgent plays the guest agent once the VM runs.
func (f *fakeVM) startAgent() *fakeFault {
	if !f.cfg.Agent || f.agent != nil {
		return nil
	}
	path := filepath.Join(f.dir, "agent.sock")
	_ = os.Remove(path) // left by an earlier fake in this directory
	l, err := net.Listen("unix", path)
	if err != nil {
		return badRequest("agent: %v", err)
	}
	f.agent = l
	go func() {
		_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != agentHealthPath {
				http.NotFound(w, r)
				return
			}
			f.mu.Lock()
			token := f.token
			f.mu.Unlock()
			if len(f.cfg.TouchPages) > 0 {
				fmt.Fprintf(w, "ready %s token %s\n", f.id, token)
				return
			}
			fmt.Fprintf(w, "ready %s\n", f.id)
		}))
	}()
	return nil
}
