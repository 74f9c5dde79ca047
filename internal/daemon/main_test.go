package daemon_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/daemon"
	"warmstart/internal/lab/synth"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/node"
	"warmstart/internal/reexec"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/s3"
	"warmstart/internal/trace"
	"warmstart/internal/vmm/replay"
)

// Environment of a daemon child process (see runChild).
const (
	// roleChildDaemon makes the test binary a daemon (runChild).
	roleChildDaemon = "test-daemon"
	// childConfigEnv names the configuration file the child daemon runs with.
	childConfigEnv = "WARMSTART_DAEMON_TEST_CONFIG"
	// childHoldEnv, when set, is a byte offset: the child's FUSE server
	// holds every read request that reaches past it until the daemon
	// begins stopping a restore.
	childHoldEnv = "WARMSTART_DAEMON_TEST_HOLD_FROM"
	// childStallRecordingEnv, when set, stalls every background recording
	// for good once it has begun (and logged msgRecordingStarted), so a
	// test can kill the daemon mid-recording.
	childStallRecordingEnv = "WARMSTART_DAEMON_TEST_STALL_RECORDING"
	// childHoldFIFOEnv, with childHoldEnv, names a FIFO: the held reads
	// go on once the test has opened it for writing and closed it, not
	// when a restore is being stopped.
	childHoldFIFOEnv = "WARMSTART_DAEMON_TEST_HOLD_FIFO"
	// childChunkGraceEnv, when set, is the S3 repository's chunk grace
	// (a Go duration), so a test can collect garbage without waiting hours.
	childChunkGraceEnv = "WARMSTART_DAEMON_TEST_CHUNK_GRACE"
	// childLeaseTTLEnv, when set, is the S3 repository's lease TTL (a Go
	// duration); the daemon then looks again at recordings left to other
	// holders every half of it.
	childLeaseTTLEnv = "WARMSTART_DAEMON_TEST_LEASE_TTL"
	// childUmaskEnv, when set, is the octal umask the child daemon runs
	// under.
	childUmaskEnv = "WARMSTART_DAEMON_TEST_UMASK"
)

// msgRecordingStarted is what the recorder logs as a recording begins.
const msgRecordingStarted = "recording startup manifest"

// Log messages of the child's read hook.
const (
	msgHolding  = "test: holding a device read"
	msgReleased = "test: held device read released"
)

func TestMain(m *testing.M) {
	reexec.Roles{
		replay.RoleReplayVMM: replay.ChildMain,
		roleChildDaemon:      runChild,
		roleSocketProber:     runSocketProber,
	}.Dispatch()
	os.Setenv("GORACE", os.Getenv("GORACE")+" atexit_sleep_ms=0")
	os.Exit(m.Run())
}

// memoryBytes keeps the reference snapshot small so the tests are fast.
const memoryBytes = 16 << 20

// fixture is one test's directory, reference snapshot and configuration.
type fixture struct {
	dir      string
	ref      synth.Paths
	layout   string // the reference layout spec
	expected string // SHA-256 the replay VMM reports for a correct restore
	cfgPath  string
	cfg      *config.Config
}

// fixtureOptions choose the configuration.
type fixtureOptions struct {
	recordOnPublish bool
	// trace replaces the reference trace the replay VMM plays.
	trace string
	// trust is the [trust] table, "" for none.
	trust string
	// socket is the API socket's path relative to the fixture's
	// directory; "" is d.sock.
	socket string
}

func newFixture(t *testing.T, o fixtureOptions) *fixture {
	t.Helper()
	// Unix socket paths are limited to 108 bytes; t.TempDir's are long.
	dir, err := os.MkdirTemp("", "wsd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A daemon killed by a failing test leaves dead mounts behind.
		ms := mountsUnder(t, dir)
		for _, m := range slices.Backward(ms) {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				t.Errorf("detach %s: %v", m, err)
			}
		}
		os.RemoveAll(dir)
	})
	f := &fixture{dir: dir}
	f.ref, err = synth.Generate(context.Background(), synth.Options{MemoryBytes: memoryBytes, Seed: 7, Dir: filepath.Join(dir, "ref")})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := os.ReadFile(f.ref.Layout)
	if err != nil {
		t.Fatal(err)
	}
	f.layout = strings.TrimSpace(string(spec))
	entries, err := trace.ReadFile(f.ref.Trace)
	if err != nil {
		t.Fatal(err)
	}
	if f.expected, err = replay.ExpectedHash(f.ref.Memory, entries, nil); err != nil {
		t.Fatal(err)
	}
	if o.trace == "" {
		o.trace = f.ref.Trace
	}
	f.writeConfig(t, o)
	return f
}

// writeConfig writes the configuration file (children load it) and loads it.
func (f *fixture) writeConfig(t *testing.T, o fixtureOptions) {
	t.Helper()
	text := fmt.Sprintf(`
[manifest]
record_after_publish = %t
[prefetch]
on_restore = true
[backend.posix_fs]
snapshot_store = %q
`, o.recordOnPublish, filepath.Join(f.dir, "store")) +
		nodeSections(f.dir, filepath.Join(f.dir, cmp.Or(o.socket, "d.sock")), f.dir, o.trace, o.trust)
	f.cfgPath = filepath.Join(f.dir, "warmstart.toml")
	f.cfg = writeAndLoadConfig(t, f.cfgPath, text)
}

// importRequest imports the reference snapshot under alias.
func (f *fixture) importRequest(alias string) api.ImportRequest {
	return api.ImportRequest{VMState: f.ref.VMState, Memory: f.ref.Memory, Alias: alias, Layout: f.layout}
}

// logSink keeps a daemon's log records and tells waiters when a message
// has been logged.
type logSink struct {
	mu      sync.Mutex
	records []logRecord
	waiters map[string]chan struct{}
}

type logRecord struct {
	msg   string
	attrs map[string]string
}

func newLogSink() *logSink { return &logSink{waiters: map[string]chan struct{}{}} }

func (s *logSink) logger() *slog.Logger { return slog.New(&sinkHandler{sink: s}) }

func (s *logSink) add(r logRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records = append(s.records, r)
	if ch, ok := s.waiters[r.msg]; ok {
		close(ch)
		delete(s.waiters, r.msg)
	}
}

// logged returns a channel closed once msg has been logged.
func (s *logSink) logged(msg string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	for _, r := range s.records {
		if r.msg == msg {
			close(ch)
			return ch
		}
	}
	if old, ok := s.waiters[msg]; ok {
		return old
	}
	s.waiters[msg] = ch
	return ch
}

// attrsOf returns the attributes of the first record of msg, or nil.
func (s *logSink) attrsOf(msg string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		if r.msg == msg {
			return r.attrs
		}
	}
	return nil
}

func (s *logSink) dump(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		t.Logf("daemon log: %s %v", r.msg, r.attrs)
	}
}

type sinkHandler struct {
	sink  *logSink
	attrs []slog.Attr
}

func (h *sinkHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *sinkHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.Resolve().String()
		return true
	})
	h.sink.add(rec)
	return nil
}

func (h *sinkHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &sinkHandler{sink: h.sink, attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], attrs...)}
}

func (h *sinkHandler) WithGroup(string) slog.Handler { return h }

// running is an in-process daemon.
type running struct {
	d      *daemon.Daemon
	client *api.Client
	log    *logSink
}

// startDaemon runs a daemon for f in this process until the test ends.
// options are what a daemon of the fixture is made from: its configuration,
// a repository on its store and its VMM driver.
func (f *fixture) options(t *testing.T) daemon.Options {
	t.Helper()
	repo, err := posixfs.Open(f.cfg.Backend.PosixFS.SnapshotStore, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	vm, err := node.NewVMM(context.Background(), f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return daemon.Options{Config: f.cfg, Repository: repo, VMM: vm}
}

func startDaemon(t *testing.T, f *fixture, tweak func(*daemon.Options)) *running {
	t.Helper()
	sink := newLogSink()
	opts := f.options(t)
	opts.Log = sink.logger()
	if tweak != nil {
		tweak(&opts)
	}
	d, served := serveInBackground(t, opts)
	client := api.NewClient(d.Endpoint())
	if opts.Listen != "" {
		token, err := api.ReadToken(f.cfg.DaemonTokenFile())
		if err != nil {
			t.Fatal(err)
		}
		client.WithToken(token)
	}
	r := &running{d: d, client: client, log: sink}
	t.Cleanup(func() {
		r.client.Close()
		shutDown(t, d, served)
		if t.Failed() {
			sink.dump(t)
		}
	})
	return r
}

// rawClient sends hand-made requests to the daemon's socket.
func rawClient(t *testing.T, socket string) *http.Client {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// metricsOf scrapes and parses /metrics.
func metricsOf(t *testing.T, c *api.Client) map[string]*dto.MetricFamily {
	t.Helper()
	text, err := c.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// matches reports whether m carries every label in want.
func matches(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// value sums the counter or gauge values of the series of name that carry
// the labels; a histogram contributes its sample count.
func value(mfs map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	sum := 0.0
	for _, m := range mfs[name].GetMetric() {
		if !matches(m, labels) {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// runChild is a daemon child process: the configuration file named by
// childConfigEnv, JSON log lines on stderr, SIGTERM shuts it down.
func runChild() int {
	if v := os.Getenv(childUmaskEnv); v != "" {
		mask, err := strconv.ParseUint(v, 8, 32)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		unix.Umask(int(mask))
	}
	cfg, err := config.Load(os.Getenv(childConfigEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	leaseTTL, err := envDuration(childLeaseTTLEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	repo, err := childRepository(cfg, leaseTTL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	vm, err := node.NewVMM(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	log := slog.New(&gateHandler{
		next: slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}),
		// Held reads go on once shutdown starts stopping a restore: the
		// stop must then wait for them before it releases the device.
		on: func(msg string) {
			if msg == "stopping restore" {
				releaseOnce.Do(func() { close(release) })
			}
			if msg == msgRecordingStarted && os.Getenv(childStallRecordingEnv) != "" {
				select {} // the recorder's goroutine logged it: hold it there
			}
		},
	})
	var fuseOpts fusedev.Options
	if v := os.Getenv(childHoldEnv); v != "" {
		holdFrom, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		var holdingOnce, releasedOnce sync.Once
		wait := func() { <-release }
		if fifo := os.Getenv(childHoldFIFOEnv); fifo != "" {
			var opened sync.Once
			wait = func() { opened.Do(func() { waitForWriter(fifo) }) }
		}
		fuseOpts.ReadHook = func(_ uint64, off int64, n int) {
			if off+int64(n) <= holdFrom {
				return
			}
			holdingOnce.Do(func() { log.Info(msgHolding, "offset", off, "bytes", n) })
			wait()
			releasedOnce.Do(func() { log.Info(msgReleased, "offset", off) })
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	opts := daemon.Options{Config: cfg, Repository: repo, VMM: vm, Log: log, FUSE: fuseOpts, ResumeRetry: leaseTTL / 2}
	if err := daemon.Run(ctx, opts); err != nil {
		log.Error("daemon failed", "err", err)
		return 1
	}
	return 0
}

// childRepository opens the repository cfg names; an S3 one with the
// chunk grace of childChunkGraceEnv and the lease TTL given (zero: the
// defaults).
func childRepository(cfg *config.Config, leaseTTL time.Duration) (repository.Repository, error) {
	key, err := node.SigningKey(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Snapshot.RepositoryBackend != config.BackendS3 {
		repo, err := posixfs.Open(cfg.Backend.PosixFS.SnapshotStore, posixfs.Options{SigningKey: key})
		if err != nil {
			return nil, err
		}
		return repo, nil
	}
	o := node.S3Options(cfg.Backend.S3)
	grace, err := envDuration(childChunkGraceEnv)
	if err != nil {
		return nil, err
	}
	o.ChunkGrace, o.LeaseTTL, o.SigningKey = grace, leaseTTL, key
	repo, err := s3.Open(context.Background(), o)
	if err != nil {
		return nil, err
	}
	return repo, nil
}

// envDuration reads a Go duration from the environment; unset is zero.
func envDuration(name string) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return d, nil
}

// waitForWriter blocks until a writer has opened the FIFO and closed it.
func waitForWriter(fifo string) {
	f, err := os.Open(fifo) // blocks until the writer opens it
	if err != nil {
		return
	}
	defer f.Close()
	io.Copy(io.Discard, f) // EOF once the writer closes it
}

// gateHandler tells on about every message once it is logged.
type gateHandler struct {
	next slog.Handler
	on   func(msg string)
}

func (h *gateHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *gateHandler) Handle(ctx context.Context, r slog.Record) error {
	err := h.next.Handle(ctx, r)
	h.on(r.Message)
	return err
}

func (h *gateHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &gateHandler{next: h.next.WithAttrs(attrs), on: h.on}
}

func (h *gateHandler) WithGroup(name string) slog.Handler {
	return &gateHandler{next: h.next.WithGroup(name), on: h.on}
}

// child is a daemon running in a child process.
type child struct {
	pid    int
	exited chan struct{}
	err    error // the exit status, once exited is closed

	mu      sync.Mutex
	lines   []map[string]any
	waiters map[string]chan struct{}
}

// startChild re-executes the test binary as a daemon for cfgPath; extra is
// added to its environment. It returns once the daemon is ready.
func startChild(t *testing.T, cfgPath string, extra ...string) *child {
	t.Helper()
	cmd := newChildCmd(cfgPath, extra...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{pid: cmd.Process.Pid, exited: make(chan struct{}), waiters: map[string]chan struct{}{}}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		c.scan(stderr)
	}()
	go func() {
		<-scanned // Wait closes the pipe; read it all first
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			c.mu.Lock()
			for _, l := range c.lines {
				t.Logf("child log: %v", l)
			}
			c.mu.Unlock()
		}
	})
	c.wait(t, "daemon ready")
	return c
}

func (c *child) scan(r io.Reader) {
	dec := json.NewDecoder(r)
	for {
		var line map[string]any
		if err := dec.Decode(&line); err != nil {
			// Anything that is not a JSON line (a panic) ends the scan;
			// the rest is drained so the child never blocks on stderr.
			io.Copy(io.Discard, io.MultiReader(dec.Buffered(), r))
			return
		}
		c.mu.Lock()
		c.lines = append(c.lines, line)
		if msg, _ := line["msg"].(string); c.waiters[msg] != nil {
			close(c.waiters[msg])
			delete(c.waiters, msg)
		}
		c.mu.Unlock()
	}
}

// wait blocks until the child logs msg, or fails the test if it exits first.
func (c *child) wait(t *testing.T, msg string) {
	t.Helper()
	c.mu.Lock()
	ch := make(chan struct{})
	seen := false
	for _, l := range c.lines {
		if l["msg"] == msg {
			seen = true
		}
	}
	if seen {
		close(ch)
	} else if old := c.waiters[msg]; old != nil {
		ch = old
	} else {
		c.waiters[msg] = ch
	}
	c.mu.Unlock()
	select {
	case <-ch:
	case <-c.exited:
		select {
		case <-ch:
		default:
			t.Fatalf("daemon child exited (%v) before logging %q", c.err, msg)
		}
	}
}

// messages returns the messages the child logged, in order.
func (c *child) messages() []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]map[string]any(nil), c.lines...)
}

// mountsUnder lists the mount points at or below dir in this mount
// namespace, innermost last.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		// id parent major:minor root mountpoint ...
		if fields := strings.Fields(line); len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	return out
}

// mounted reports whether anything is mounted at dir in this mount namespace.
func mounted(t *testing.T, dir string) bool {
	t.Helper()
	return slices.Contains(mountsUnder(t, dir), dir)
}

func newChildCmd(cfgPath string, extra ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(reexec.Environ(os.Environ(), roleChildDaemon), childConfigEnv+"="+cfgPath), extra...)
	// A child whose test died must not keep serving its mount.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}
