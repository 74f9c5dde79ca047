package firecracker

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
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

	"warmstart/internal/reexec"
)

// In role roleFake the test binary acts as a fake Firecracker configured
// by the fakeConfig file fakeEnv names.
const (
	roleFake = "test-fake-firecracker"
	fakeEnv  = "WARMSTART_FAKE_FIRECRACKER"
)

func TestMain(m *testing.M) {
	reexec.Roles{roleFake: func() int { return runFakeFirecracker(os.Getenv(fakeEnv), os.Args[1:]) }}.Dispatch()
	os.Exit(m.Run())
}

// fakeVersions are the Firecracker releases the fake plays: the newest
// patch release of every minor version the driver supports, each with its
// API description vendored in testdata (see testdata/README.md).
var fakeVersions = []string{"1.12.1", "1.13.2", "1.14.4", "1.15.1", "1.16.1", newestFakeVersion}

// newestFakeVersion is what a fake plays unless told otherwise.
const newestFakeVersion = "1.17.0-dev"

// fakeConfig steers a fake Firecracker.
type fakeConfig struct {
	// Version is the release the fake plays; newestFakeVersion when
	// empty. It answers GET /version with it, refuses request bodies that
	// release's API description does not allow (Firecracker's request
	// types are deny_unknown_fields), and speaks that release's uffd
	// handshake. A version with no description in testdata (one below
	// the driver's floor) answers GET / and GET /version only.
	Version string
	// SpecPath is that version's API description; fakeBinary sets it.
	SpecPath string
	// DieOnStart makes it log an error and exit 1 before binding the socket.
	DieOnStart bool
	// NoSocket makes it run without ever binding the API socket.
	NoSocket bool
	// IgnoreCtrlAltDel makes it answer SendCtrlAltDel and keep running.
	IgnoreCtrlAltDel bool
	// HangLoad makes PUT /snapshot/load block until the client goes away,
	// after handing guest memory to a Uffd handler.
	HangLoad bool
	// CrashInLoad makes the process exit (status 1) inside PUT
	// /snapshot/load, once it has handed guest memory to a Uffd handler.
	CrashInLoad bool
	// Agent makes it serve GET /health on <runtime dir>/agent.sock while
	// the VM runs, as the guest agent would.
	Agent bool
	// RecordPath, when set, receives one JSON line per API request.
	RecordPath string
	// TouchPages makes the fake play a guest with a working set: once the
	// VM runs it reads these page offsets of guest memory in order, and
	// only then does its agent answer (with the token it found).
	TouchPages []int64
	// CrashInCreate makes the process exit (status 1) inside PUT
	// /snapshot/create, once it has written part of the memory file.
	CrashInCreate bool
	// SyncFailures makes that many snapshot creates fail as Firecracker's
	// fails when sync_all of the memory file fails: after the dump, with
	// the dirty pages already forgotten.
	SyncFailures int
	// ResumeFailures makes that many resumes of a paused restored VM
	// fail as Firecracker's does when a vCPU does not answer: 400, the
	// VM still paused.
	ResumeFailures int
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
	if cfg.Version == "" {
		cfg.Version = newestFakeVersion
	}
	spec, err := filepath.Abs(specPath(cfg.Version))
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(fakeVersions, cfg.Version) {
		cfg.SpecPath = spec
	}
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
		reexec.Env, roleFake, fakeEnv, shellQuote(cfgPath), shellQuote(exe))
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
	fmt.Fprintf(logFile, "[%s:INFO] fake firecracker %s running, level %s, show-level %v\n", *id, cfg.Version, *level, *showLevel)
	if cfg.DieOnStart {
		fmt.Fprintf(logFile, "[%s:ERROR] refusing to start: kernel image is corrupt\n", *id)
		fmt.Fprintln(os.Stderr, "console: early panic")
		return 1
	}
	if cfg.NoSocket {
		select {}
	}
	vm, err := newFakeVM(cfg, *id, dir, logFile)
	if err != nil {
		fmt.Fprintf(logFile, "[%s:ERROR] %v\n", *id, err)
		return 1
	}
	l, err := net.Listen("unix", *apiSock)
	if err != nil {
		fmt.Fprintf(logFile, "[%s:ERROR] bind api socket: %v\n", *id, err)
		return 1
	}
	// Firecracker leaves its sockets behind; so does the fake.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	// Guest memory is touched from goroutines of this process, and a
	// goroutine blocked in a fault on it would hold up a collection's
	// stop-the-world, and with it the API server.
	debug.SetGCPercent(-1)
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
	version  Version
	spec     *apiSpec // nil: a version without a description in testdata
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
	// ctrlAltDel is a SendCtrlAltDel a paused guest has yet to act on.
	ctrlAltDel bool
	// token is what the guest keeps in memory: drawn at boot, or read
	// back from memory by a restored guest.
	token string
	// mem is guest memory mapped by a snapshot load; guestRan says the
	// restored guest has begun to run on it.
	mem      []byte
	guestRan bool
	// tracking: the VM tracks dirty pages (machine config or load);
	// dirty are the pages written since the load or the last snapshot.
	tracking      bool
	dirty         map[int64]bool
	syncsFailed   int
	resumesFailed int
}

func newFakeVM(cfg fakeConfig, id, dir string, log io.Writer) (*fakeVM, error) {
	if cfg.Version == "" {
		cfg.Version = newestFakeVersion
	}
	v, err := ParseVersion(cfg.Version)
	if err != nil {
		return nil, err
	}
	f := &fakeVM{
		cfg: cfg, version: v, id: id, dir: dir, log: log,
		shutdown: make(chan struct{}),
		state:    "Not started",
		machine:  MachineConfig{VCPUCount: 1, MemSizeMiB: 128},
	}
	if cfg.SpecPath != "" {
		if f.spec, err = readSpec(cfg.SpecPath); err != nil {
			return nil, err
		}
	}
	return f, nil
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
	fault := f.refuse(r.Method, r.URL.Path, body)
	if fault == nil && f.cfg.HangLoad && r.URL.Path == "/snapshot/load" {
		f.hangLoad(r.Context(), body)
		return
	}
	var out any
	if fault == nil {
		f.mu.Lock()
		out, fault = f.handle(r.Method, r.URL.Path, body)
		f.mu.Unlock()
	}
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
}

// refuse answers, as the played version would, a request its API does not
// have or a body its request types do not accept: they are
// deny_unknown_fields, so one field too many is a 400.
func (f *fakeVM) refuse(method, path string, body []byte) *fakeFault {
	if f.spec == nil {
		if method == http.MethodGet && (path == "/" || path == "/version") {
			return nil
		}
		return badRequest("this fake plays Firecracker %s without its API description: only GET / and GET /version", f.version)
	}
	if _, errs := f.spec.checkRequest(method, path, body); len(errs) > 0 {
		return badRequest("An error occurred when deserializing the json body of a request: %v", errors.Join(errs...))
	}
	return nil
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
		return InstanceInfo{AppName: "Firecracker", ID: f.id, State: f.state, VMMVersion: f.cfg.Version}, nil
	case method == http.MethodGet && path == "/version":
		return firecrackerVersion{FirecrackerVersion: f.cfg.Version}, nil
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
		return nil, f.setState(body)
	case method == http.MethodPut && path == "/snapshot/create":
		return nil, f.createSnapshot(body)
	case method == http.MethodPut && path == "/snapshot/load":
		return nil, f.loadSnapshot(body)
	}
	return nil, &fakeFault{status: http.StatusBadRequest, msg: fmt.Sprintf("Invalid request method and/or path: %s %s.", method, path)}
}

func (f *fakeVM) setState(body []byte) *fakeFault {
	var v vmBody
	if err := json.Unmarshal(body, &v); err != nil {
		return badRequest("%v", err)
	}
	if f.state == "Not started" {
		return badRequest("The microVM is not running.")
	}
	if v.State == VMPaused {
		f.state = "Paused"
		return nil
	}
	if f.guestRan && f.resumesFailed < f.cfg.ResumeFailures {
		f.resumesFailed++
		// resume_vcpus failing: VmmError::VcpuMessage (src/vmm/src/lib.rs).
		return badRequest("Internal Vmm error: Failed to message the vCPUs.")
	}
	f.state = "Running"
	if f.ctrlAltDel {
		// The guest acts on the key press it was sent while paused.
		f.ctrlAltDel = false
		f.reboot()
	}
	if f.mem != nil && !f.guestRan {
		f.guestRan = true
		go f.runGuest(f.mem)
		return nil
	}
	return f.startAgent()
}

// action runs PUT /actions. SendCtrlAltDel is what Firecracker allows
// once the microVM exists, paused or running: a paused guest acts on it
// when it runs again.
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
		f.tracking = f.machine.TrackDirtyPages
		return f.startAgent()
	case ActionSendCtrlAltDel:
		switch f.state {
		case "Not started":
			return badRequest("The requested operation is not supported before starting the microVM.")
		case "Paused":
			f.ctrlAltDel = true
		default:
			f.reboot()
		}
		return nil
	case ActionFlushMetrics:
		return nil
	}
	return badRequest("unknown action %q", a.ActionType)
}

// reboot is the guest rebooting on Ctrl-Alt-Del, which ends Firecracker.
func (f *fakeVM) reboot() {
	if !f.cfg.IgnoreCtrlAltDel {
		f.stopOnce.Do(func() { close(f.shutdown) })
	}
}

// createSnapshot runs PUT /snapshot/create as Firecracker does: 1.12
// refuses a Diff without dirty page tracking, a running VM refuses to save
// its state before any file is written, the state file is written, then
// the memory file (writeSnapshotMemory).
func (f *fakeVM) createSnapshot(body []byte) *fakeFault {
	var c SnapshotCreate
	if err := json.Unmarshal(body, &c); err != nil {
		return badRequest("%v", err)
	}
	if c.SnapshotType == SnapshotDiff && !f.tracking && !f.version.AtLeast(mincoreDiffSince) {
		return badRequest("The requested operation is not supported: Diff snapshots are not allowed on uVMs with dirty page tracking disabled.")
	}
	if f.state != "Paused" {
		return badRequest("Create snapshot error: Cannot save the microVM state: Operation not allowed: save/restore unavailable while running")
	}
	state, _ := encodeFakeState(f.machine)
	if err := os.WriteFile(c.SnapshotPath, state, 0o600); err != nil {
		return badRequest("Create snapshot error: Cannot perform open on the snapshot backing file: %v", err)
	}
	if f.mem == nil {
		// A booted VM: its memory is the markers of its token.
		if err := writeGuestMemory(c.MemFilePath, f.machine.MemSizeMiB<<20, f.token, f.cfg.TouchPages); err != nil {
			return badRequest("%v", err)
		}
		return nil
	}
	return f.writeSnapshotMemory(c.MemFilePath, c.SnapshotType == SnapshotDiff)
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
			if r.URL.Path == guestPagePath {
				f.guestPage(w, r)
				return
			}
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
