package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/daemon"
	"warmstart/internal/reexec"
	"warmstart/internal/repository"
)

// The attack these tests reproduce: a local user who is not the daemon's
// spins on connect() to the API socket while the daemon starts, hoping to
// get in before the socket is made private, or connects later to a socket
// an operator left open.

const (
	// roleSocketProber makes the test binary the other user (runSocketProber).
	roleSocketProber = "test-socket-prober"
	// proberSocketEnv is the socket the prober connects to.
	proberSocketEnv = "WARMSTART_DAEMON_TEST_PROBE_SOCKET"
	// proberAfterEnv is how many connects the prober makes after the test
	// tells it the daemon is ready (a line on its stdin).
	proberAfterEnv = "WARMSTART_DAEMON_TEST_PROBE_AFTER"
	// otherUID is the user the prober runs as: nobody.
	otherUID = 65534
	// probeAnswerWait bounds how long a prober that got a connection waits
	// for an answer: a daemon answers a request queued in its backlog as
	// soon as it serves, within milliseconds.
	probeAnswerWait = 20 * time.Second
	// msgProberSpinning is the prober's first line, once it has tried once.
	msgProberSpinning = "spinning"
)

// probeResult is what the prober saw, printed as JSON when it ends.
type probeResult struct {
	// Attempts connects in all, AfterReady of them once the test said
	// the daemon was ready.
	Attempts, AfterReady int
	// Refused counts failed connects by error (ENOENT, EACCES, ...).
	Refused map[string]int
	// Closed counts connections that ended without an answer.
	Closed int
	// Answered counts connections the daemon answered; Answer is the
	// first answer's status line.
	Answered int
	Answer   string
}

// proberThreads connect at once, so that a window of microseconds
// between the socket's creation and its lock-down is hit if there is one.
const proberThreads = 4

// runSocketProber connects to the socket again and again from
// proberThreads threads, sending GET /snapshots on every connection it
// gets, until it has made the number of connects proberAfterEnv says after
// the test wrote a line on its stdin; it prints msgProberSpinning after its
// first connect and its probeResult last.
func runSocketProber() int {
	socket := os.Getenv(proberSocketEnv)
	after, err := strconv.Atoi(os.Getenv(proberAfterEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var ready, done atomic.Bool
	var afterReady atomic.Int64
	results := make(chan probeResult, proberThreads)
	var spinning sync.Once
	for range proberThreads {
		go func() {
			res := probeResult{Refused: map[string]int{}}
			for !done.Load() {
				wasReady := ready.Load()
				probeOnce(socket, &res)
				res.Attempts++
				spinning.Do(func() { fmt.Println(msgProberSpinning) })
				if wasReady {
					res.AfterReady++
					if afterReady.Add(1) >= int64(after) {
						done.Store(true)
					}
				}
			}
			results <- res
		}()
	}
	bufio.NewReader(os.Stdin).ReadString('\n')
	ready.Store(true)
	total := probeResult{Refused: map[string]int{}}
	for range proberThreads {
		total.add(<-results)
	}
	if err := json.NewEncoder(os.Stdout).Encode(total); err != nil {
		return 1
	}
	return 0
}

func (r *probeResult) add(o probeResult) {
	r.Attempts += o.Attempts
	r.AfterReady += o.AfterReady
	for k, v := range o.Refused {
		r.Refused[k] += v
	}
	r.Closed += o.Closed
	if r.Answered += o.Answered; r.Answer == "" {
		r.Answer = o.Answer
	}
}

// probeOnce makes one connect, with raw system calls to keep each try
// short, and, if it gets a connection, one request.
func probeOnce(socket string, res *probeResult) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		res.Refused[err.Error()]++
		return
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: socket}); err != nil {
		unix.Close(fd)
		res.Refused[unixErrorName(err)]++
		return
	}
	conn, err := net.FileConn(os.NewFile(uintptr(fd), socket))
	unix.Close(fd)
	if err != nil {
		res.Refused[err.Error()]++
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(probeAnswerWait))
	if _, err := io.WriteString(conn, "GET /snapshots HTTP/1.0\r\n\r\n"); err != nil {
		res.Closed++
		return
	}
	line, _ := bufio.NewReader(conn).ReadString('\n')
	if !strings.HasPrefix(line, "HTTP/") {
		res.Closed++
		return
	}
	if res.Answered++; res.Answered == 1 {
		res.Answer = strings.TrimSpace(line)
	}
}

func unixErrorName(err error) string {
	switch {
	case errors.Is(err, unix.ENOENT):
		return "ENOENT"
	case errors.Is(err, unix.EACCES):
		return "EACCES"
	case errors.Is(err, unix.ECONNREFUSED):
		return "ECONNREFUSED"
	}
	return err.Error()
}

// prober is a running prober process.
type prober struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startProber runs the prober as otherUID against the socket at rel under
// dir, and returns once it has made its first connect. The user is handed
// this test binary and dir as open descriptors and reaches both through
// /proc/self/fd: the build directory and the temporary directory above dir
// may be private (CI runs with a private TMPDIR), while dir, its runtime
// directory and the socket are what the test is about.
func startProber(t *testing.T, dir, rel string, after int) *prober {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	base, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	// ExtraFiles[i] is descriptor 3+i in the prober.
	cmd := &exec.Cmd{Path: "/proc/self/fd/3", Args: []string{"prober", "-test.run=^$"}, Dir: "/"}
	cmd.ExtraFiles = []*os.File{bin, base}
	cmd.Env = append(reexec.Environ(os.Environ(), roleSocketProber),
		proberSocketEnv+"="+filepath.Join("/proc/self/fd/4", rel), proberAfterEnv+"="+strconv.Itoa(after))
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: otherUID, Gid: otherUID, Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
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
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("prober stderr: %s", stderr.String())
		}
	})
	p := &prober{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	if line, err := p.out.ReadString('\n'); strings.TrimSpace(line) != msgProberSpinning {
		t.Fatalf("prober did not start: %q, %v; stderr: %s", line, err, stderr.String())
	}
	return p
}

// finish tells the prober the daemon is ready and returns what it saw.
func (p *prober) finish(t *testing.T) probeResult {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "ready\n"); err != nil {
		t.Fatal(err)
	}
	var res probeResult
	if err := json.NewDecoder(p.out).Decode(&res); err != nil {
		t.Fatalf("prober result: %v", err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("prober: %v", err)
	}
	return res
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a process as another user")
	}
}

// socketRel is the daemon's socket relative to the fixture's directory.
func socketRel(t *testing.T, f *fixture) string {
	t.Helper()
	rel, err := filepath.Rel(f.dir, f.cfg.Daemon.Socket)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// openToOthers makes the fixture's directory enterable by every user, as
// /run is, so only the daemon's own permissions stand in the way.
func openToOthers(t *testing.T, f *fixture) {
	t.Helper()
	if err := os.Chmod(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestAPISocketNeverReachableByOtherUsers is the reported attack: the
// runtime directory exists with mode 0755, the daemon starts under umask
// 000 with its socket in it, and another user spins on connect from before
// the start until well after the daemon is ready. That user must never
// reach the socket, in any of several starts, and the directory is
// private once the daemon has started.
func TestAPISocketNeverReachableByOtherUsers(t *testing.T) {
	requireRoot(t)
	for i := range attackStarts {
		f := newFixture(t, fixtureOptions{socket: "run/ws.sock"})
		if err := os.Mkdir(f.cfg.Runtime.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		attackStart(t, f, i)
		fi, err := os.Stat(f.cfg.Runtime.Dir)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o700 {
			t.Errorf("start %d: the runtime directory has mode %v after the start, want it tightened to 0700", i, perm)
		}
	}
}

// TestAPISocketBornPrivate runs the same attack on a socket kept outside
// the runtime directory, in a directory every user may enter: the socket
// itself must never let the other user in while it is being created.
func TestAPISocketBornPrivate(t *testing.T) {
	requireRoot(t)
	for i := range attackStarts {
		f := newFixture(t, fixtureOptions{socket: "api/ws.sock"})
		if err := os.Mkdir(filepath.Dir(f.cfg.Daemon.Socket), 0o755); err != nil {
			t.Fatal(err)
		}
		attackStart(t, f, i)
	}
}

// attackStarts is how many daemon starts each attack test makes: the
// window it looks for was hit in most starts of the code it reproduces.
const attackStarts = 3

// attackStart opens the fixture's directory to every user, starts the
// prober, starts a daemon child under umask 000, lets the prober connect
// 100 times more once the daemon is ready, stops the daemon and fails t if
// the prober ever reached the socket.
func attackStart(t *testing.T, f *fixture, i int) {
	t.Helper()
	openToOthers(t, f)
	p := startProber(t, f.dir, socketRel(t, f), 100)
	c := startChild(t, f.cfgPath, childUmaskEnv+"=000")
	res := p.finish(t)
	t.Logf("start %d: %+v", i, res)
	if res.Answered > 0 {
		t.Fatalf("start %d: uid %d was answered %d times (%q) on the daemon's socket", i, otherUID, res.Answered, res.Answer)
	}
	// Not even reached: a connection the daemon closes unanswered, or a
	// socket not yet listening, means the first defences failed.
	if res.Closed > 0 || res.Refused["ECONNREFUSED"] > 0 {
		t.Fatalf("start %d: uid %d reached the socket (%d connections closed unanswered, %d refused by a socket not yet listening)",
			i, otherUID, res.Closed, res.Refused["ECONNREFUSED"])
	}
	if res.AfterReady < 100 {
		t.Fatalf("start %d: the prober made %d connects after ready, want 100", i, res.AfterReady)
	}
	if err := syscall.Kill(c.pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if <-c.exited; c.err != nil {
		t.Fatalf("start %d: daemon child exited with %v", i, c.err)
	}
}

// TestAPISocketAnswersOnlyItsOwner opens the socket to every user by hand,
// as an operator might: the daemon still closes the other user's
// connections unanswered, says so in its log, and answers its own user.
func TestAPISocketAnswersOnlyItsOwner(t *testing.T) {
	requireRoot(t)
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	openToOthers(t, f)
	if err := os.Chmod(f.cfg.Daemon.Socket, 0o666); err != nil {
		t.Fatal(err)
	}
	p := startProber(t, f.dir, socketRel(t, f), 20)
	res := p.finish(t)
	t.Logf("%+v", res)
	if res.Answered > 0 {
		t.Fatalf("uid %d was answered %d times (%q)", otherUID, res.Answered, res.Answer)
	}
	if res.Closed == 0 {
		t.Fatalf("the prober never connected (%v): the test opened the socket to it", res.Refused)
	}
	<-r.log.logged(daemon.MsgRefusedPeer)
	if uid := r.log.attrsOf(daemon.MsgRefusedPeer)["peer_uid"]; uid != strconv.Itoa(otherUID) {
		t.Errorf("the refusal names uid %q, want %d", uid, otherUID)
	}
	if _, err := r.client.Snapshots(context.Background(), repository.Filter{}); err != nil {
		t.Fatalf("the daemon's own user is not answered: %v", err)
	}
}

// TestRuntimeDirOfAnotherUserRefused: a runtime directory another user
// owns could be used to reach the daemon's sockets; the daemon does not
// start in it. Nor does it put its socket in a directory others can write
// without the sticky bit, where they could replace it.
func TestRuntimeDirOfAnotherUserRefused(t *testing.T) {
	requireRoot(t)
	f := newFixture(t, fixtureOptions{})
	if err := os.Mkdir(f.cfg.Runtime.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(f.cfg.Runtime.Dir, otherUID, otherUID); err != nil {
		t.Fatal(err)
	}
	opts := f.options(t)
	if _, err := daemon.New(opts); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("New with a runtime directory of uid %d: %v, want a refusal naming the owner", otherUID, err)
	}

	g := newFixture(t, fixtureOptions{socket: "shared/ws.sock"})
	shared := filepath.Dir(g.cfg.Daemon.Socket)
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	if _, err := daemon.New(g.options(t)); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Fatalf("New with the socket in a world-writable directory: %v, want a refusal", err)
	}
}
