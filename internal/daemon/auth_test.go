package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/repository/repotest"
)

// The TCP API answers only requests with the daemon's bearer token; serve
// creates the token file, mode 0600, when it does not exist.
func TestTCPRequiresTheToken(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, func(o *daemon.Options) { o.Listen = "127.0.0.1:0" })
	fi, err := os.Stat(f.cfg.DaemonTokenFile())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %s: mode %v, %v; want 0600", f.cfg.DaemonTokenFile(), fi.Mode().Perm(), err)
	}
	ctx := context.Background()
	for name, c := range map[string]*api.Client{
		"no token":    api.NewClient(r.d.Endpoint()),
		"wrong token": api.NewClient(r.d.Endpoint()).WithToken("0123"),
	} {
		_, err := c.Health(ctx)
		var ae *api.APIError
		if !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: health = %v, want HTTP 401", name, err)
		}
		c.Close()
	}
	if _, err := r.client.Health(ctx); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	resp, err := http.Get(r.d.Endpoint() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /metrics without a token: HTTP %d, want 401", resp.StatusCode)
	}
}

// Off loopback the token file must be configured; the daemon refuses to
// start, before it mounts anything, rather than serve without one.
func TestNonLoopbackNeedsATokenFile(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	opts := f.options(t)
	opts.Listen = "0.0.0.0:0"
	_, err := daemon.New(opts)
	if !errors.Is(err, daemon.ErrNoToken) {
		t.Fatalf("New on 0.0.0.0 without token_file = %v, want ErrNoToken", err)
	}
	if ms := mountsUnder(t, f.dir); len(ms) != 0 {
		t.Fatalf("a refused start left mounts: %v", ms)
	}
}

// API imports read only from [daemon] import_dirs, with symlinks resolved
// first, and the refusal names the key.
func TestImportOnlyFromImportDirs(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	ctx := context.Background()
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(f.dir, "innocent")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"outside": secret, "symlink out": link} {
		req := f.importRequest("")
		req.Memory, req.Layout = path, ""
		_, err := r.client.Import(ctx, req)
		var ae *api.APIError
		if !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden || ae.Field != "memory" ||
			!strings.Contains(ae.Message, "import_dirs") {
			t.Errorf("%s: import = %v, want a 403 on memory naming import_dirs", name, err)
		}
	}
	if _, err := r.client.Import(ctx, f.importRequest("ok")); err != nil {
		t.Fatalf("import from an import dir: %v", err)
	}
}

// An import naming a path outside [daemon] import_dirs is refused with
// the same 403 whatever is there — nothing, a directory, a FIFO, an empty
// file, a path climbing out with ".." — so a client cannot probe the
// existence, type or size of files the daemon would not import.
func TestImportOutsideImportDirsTellsNothing(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	outside := t.TempDir()
	fifo := filepath.Join(outside, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(outside, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	climbOut := f.dir + strings.Repeat("/..", strings.Count(f.dir, "/")) + empty
	paths := []string{filepath.Join(outside, "absent"), outside, fifo, empty, climbOut}
	// A directory symlink inside an import dir that leads out: what lies
	// beyond it is as unknown as any other outside path.
	out := filepath.Join(f.dir, "out")
	if err := os.Symlink(outside, out); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"absent", "fifo", "empty", "empty/x", "."} {
		paths = append(paths, filepath.Join(out, name))
	}
	// Symlinks that go out and come back in, through a directory that
	// exists outside or one that does not, absolutely or relatively, and
	// an absolute one that never leaves: all one answer, so none tells
	// whether the outside directory exists (nor hangs on one that hangs).
	if err := os.Mkdir(filepath.Join(outside, "exists"), 0o700); err != nil {
		t.Fatal(err)
	}
	inside := f.ref.Memory
	back := strings.Repeat("../", 1+strings.Count(strings.TrimPrefix(outside, "/"), "/")) + strings.TrimPrefix(inside, "/")
	for name, target := range map[string]string{
		"via-existing":    filepath.Join(outside, "exists") + "/../../" + back,
		"via-missing":     filepath.Join(outside, "missing") + "/../../" + back,
		"via-relative":    "../" + strings.Repeat("../", strings.Count(strings.TrimPrefix(f.dir, "/"), "/")) + strings.TrimPrefix(outside, "/") + "/exists/../../" + back,
		"absolute-inside": inside,
	} {
		link := filepath.Join(f.dir, name)
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, link)
	}
	for _, path := range paths {
		for _, field := range []string{"vm_state", "memory"} {
			req := f.importRequest("")
			if field == "vm_state" {
				req.VMState = path
			} else {
				req.Memory, req.Layout = path, ""
			}
			_, err := r.client.Import(context.Background(), req)
			var ae *api.APIError
			want := field + " " + path + " is outside [daemon] import_dirs (no absolute symlinks)"
			if !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden || ae.Field != field || ae.Message != want {
				t.Errorf("%s %s: import = %v, want a 403 %q", field, path, err, want)
			}
		}
	}
}

// With no import_dirs every API import is refused with 403, before any
// file it names is looked at: one that is not there included.
func TestImportsOffWithoutImportDirs(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	f.cfg.Daemon.ImportDirs = nil
	r := startDaemon(t, f, nil)
	absent := f.importRequest("")
	absent.VMState = filepath.Join(t.TempDir(), "absent")
	for _, req := range []api.ImportRequest{f.importRequest(""), absent} {
		_, err := r.client.Import(context.Background(), req)
		var ae *api.APIError
		if !errors.As(err, &ae) || ae.StatusCode != http.StatusForbidden || !strings.Contains(ae.Message, "import_dirs") {
			t.Errorf("import of %s with no import_dirs = %v, want a 403 naming import_dirs", req.VMState, err)
		}
	}
}

// A second daemon with the same runtime directory fails at once, naming
// the first one's pid, and touches nothing of the live daemon's: not its
// restore directories, not its socket.
func TestSecondDaemonOnARuntimeDirFailsAtOnce(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, func(o *daemon.Options) { o.Listen = "127.0.0.1:0" })
	keep := filepath.Join(f.cfg.Runtime.Dir, "daemon", "restores", "held", "uffd.sock")
	if err := os.MkdirAll(filepath.Dir(keep), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keep, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	second := *f.cfg
	second.Memory.FUSEMount = filepath.Join(f.dir, "mnt2")
	opts := f.options(t)
	opts.Config, opts.Listen = &second, "127.0.0.1:0"
	_, err := daemon.New(opts)
	if !errors.Is(err, daemon.ErrRuntimeDirInUse) || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Fatalf("second daemon = %v, want ErrRuntimeDirInUse naming pid %d", err, os.Getpid())
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("the live daemon's restore directory was touched: %v", err)
	}
	if _, err := r.client.Health(context.Background()); err != nil {
		t.Fatalf("the live daemon stopped answering: %v", err)
	}
}

// A client that sends its body a byte at a time holds no request open for
// long, and SIGTERM's ordered shutdown completes within 10 s regardless.
func TestTricklingClientDoesNotDelayShutdown(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	d, served := serveInBackground(t, f.options(t))
	conn, err := net.Dial("unix", d.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "POST /snapshots/import HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	stopTrickle := make(chan struct{})
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopTrickle:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return // the daemon closed the connection
				}
			}
		}
	}()
	defer func() { close(stopTrickle); <-trickled }()
	// Let the request reach its handler before shutdown begins.
	buf := make([]byte, 1)
	conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	conn.Read(buf)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("shutdown took %v with a trickling client, want at most 10s", took)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

// The authentication scheme is case-insensitive (RFC 9110, 11.1): a client
// sending "bearer TOKEN" is let in; another scheme or token is not.
func TestTokenSchemeIsCaseInsensitive(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, func(o *daemon.Options) { o.Listen = "127.0.0.1:0" })
	data, err := os.ReadFile(f.cfg.DaemonTokenFile())
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(data))
	for header, want := range map[string]int{
		"Bearer " + token:       http.StatusOK,
		"bearer " + token:       http.StatusOK,
		"BEARER " + token:       http.StatusOK,
		"Basic " + token:        http.StatusUnauthorized,
		"Bearer " + token + "x": http.StatusUnauthorized,
		"Bearer":                http.StatusUnauthorized,
		token:                   http.StatusUnauthorized,
	} {
		req, err := http.NewRequest(http.MethodGet, r.d.Endpoint()+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Authorization %q: HTTP %d, want %d", strings.Replace(header, token, "TOKEN", 1), resp.StatusCode, want)
		}
	}
}

// An import reads the very files that passed the import_dirs check:
// swapping a directory of the path for a symlink to outside files while
// the import runs (here while it copies a large vm_state, before it
// reaches the memory file) cannot make it read them.
func TestImportReadsTheFilesItChecked(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	sub, outside := filepath.Join(f.dir, "sub"), t.TempDir()
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	mem, err := os.ReadFile(f.ref.Memory)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "memory"), mem, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range mem {
		mem[i] ^= 0xff
	}
	if err := os.WriteFile(filepath.Join(outside, "memory"), mem, 0o600); err != nil {
		t.Fatal(err)
	}
	// A large vm_state holds the import in its copy long enough to swap.
	vmState := filepath.Join(sub, "vm_state")
	if err := os.WriteFile(vmState, make([]byte, 128<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	req := api.ImportRequest{VMState: vmState, Memory: filepath.Join(sub, "memory"), Layout: f.layout}
	type result struct {
		resp api.ImportResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := r.client.Import(context.Background(), req)
		done <- result{resp, err}
	}()
	if !waitForGlob(t, filepath.Join(f.dir, "store", "snapshots", "*", ".vm_state.bin.*"), done) {
		t.Fatal("the import ended before it was seen copying vm_state: nothing was swapped")
	}
	if err := os.Rename(sub, sub+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, sub); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("import: %v", res.err)
	}
	if got, want := res.resp.Record.MemorySHA256, repotest.FileSHA256(t, filepath.Join(sub+".real", "memory")); got != want {
		t.Fatalf("published memory %s, want the checked file's %s (the outside file's is %s)", got, want,
			repotest.FileSHA256(t, filepath.Join(outside, "memory")))
	}
}

// waitForGlob polls until pattern matches a file, reporting false if done
// is ready first (without taking its value); it fails the test if neither
// happens within guardWait.
func waitForGlob[T any](t *testing.T, pattern string, done chan T) bool {
	t.Helper()
	deadline := time.Now().Add(guardWait)
	for time.Now().Before(deadline) {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return true
		}
		if len(done) > 0 {
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Fatalf("no file matched %s within %v", pattern, guardWait)
	return false
}

// guardWait bounds waits that only run out when the code under test is
// broken.
const guardWait = 30 * time.Second

// A linked API import hard-links the files it checked into the store and
// only takes their write bits away: a private file stays private.
func TestLinkedImportLinksTheCheckedFiles(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	req := api.ImportRequest{Layout: f.layout, Link: true}
	for _, c := range []struct {
		src string
		dst *string
	}{{f.ref.VMState, &req.VMState}, {f.ref.Memory, &req.Memory}} {
		data, err := os.ReadFile(c.src)
		if err != nil {
			t.Fatal(err)
		}
		*c.dst = filepath.Join(f.dir, "linked-"+filepath.Base(c.src))
		if err := os.WriteFile(*c.dst, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := r.client.Import(context.Background(), req)
	if err != nil {
		t.Fatalf("linked import: %v", err)
	}
	stored, err := os.Stat(filepath.Join(f.dir, "store", "snapshots", resp.Record.ID, "memory.bin"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Stat(req.Memory)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(src, stored) {
		t.Errorf("stored memory is not the linked source's inode")
	}
	if src.Mode().Perm() != 0o400 {
		t.Errorf("linked source (was 0600) has mode %v, want 0400", src.Mode().Perm())
	}
}

// A daemon serving TCP refuses a token file others may read or write, or
// that another user owns, and a token short enough to guess: any local
// user could otherwise act as a client.
func TestWeakTokenFileRefused(t *testing.T) {
	for _, c := range []struct {
		name  string
		token string
		mode  os.FileMode
		want  string
	}{
		{"world-readable", strings.Repeat("ab", 32), 0o644, "open to group or others (mode 0644)"},
		{"group-writable", strings.Repeat("ab", 32), 0o620, "open to group or others (mode 0620)"},
		{"short", "a", 0o600, "token of 1 characters: want at least 16"},
		{"space", "abcdefabcdefabcdef ab", 0o600, "a character a header cannot carry (byte 18)"},
		{"control byte", "abcdefabcdefabcdef\x00\x01", 0o600, "a character a header cannot carry (byte 18)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{})
			path := f.cfg.DaemonTokenFile()
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(c.token+"\n"), c.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, c.mode); err != nil { // past the umask
				t.Fatal(err)
			}
			opts := f.options(t)
			opts.Listen = "127.0.0.1:0"
			d, err := daemon.New(opts)
			if err == nil {
				d.Shutdown(context.Background())
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("daemon.New with a %s token file = %v, want %q", c.name, err, c.want)
			}
		})
	}
}

// A relative symlink inside an import dir that names a file inside it is
// followed: only a walk that leads out is refused (and any absolute
// symlink, TestImportOutsideImportDirsTellsNothing).
func TestImportFollowsSymlinksThatStayInside(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	target, err := filepath.Rel(f.dir, f.ref.Memory)
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(f.dir, "rel-memory")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	req := f.importRequest("linked")
	req.Memory = link
	if _, err := r.client.Import(context.Background(), req); err != nil {
		t.Errorf("import through %s: %v", link, err)
	}
}

// An import's errors name the files as the client sent them, not as the
// daemon handed them to the repository (/proc/self/fd/N): here a link
// across file systems, which cannot be made.
func TestImportErrorsNameTheSentPaths(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	other := filepath.Join(f.dir, "other-fs")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", other, "tmpfs", 0, "size=64m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(other, syscall.MNT_DETACH) })
	data, err := os.ReadFile(f.ref.Memory)
	if err != nil {
		t.Fatal(err)
	}
	req := f.importRequest("")
	req.Memory, req.Link = filepath.Join(other, "memory"), true
	if err := os.WriteFile(req.Memory, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = r.client.Import(context.Background(), req)
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Field != "link" ||
		!strings.Contains(err.Error(), req.Memory) || strings.Contains(err.Error(), "/proc/self/fd") ||
		!strings.Contains(err.Error(), "a hard link cannot cross file systems") || !strings.Contains(err.Error(), "without --link") {
		t.Fatalf("linked import across file systems = %v, want a 400 on link naming %s, saying a hard link cannot "+
			"cross file systems and to import without --link", err, req.Memory)
	}
}
