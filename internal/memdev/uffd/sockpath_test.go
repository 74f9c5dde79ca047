package uffd

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestSocketPathWorksUnderADeepDirectory(t *testing.T) {
	// Short links, and the sweep of dangling ones, stay in the test's own
	// directory.
	t.Setenv("TMPDIR", t.TempDir())
	deep := deepDir(t)
	p, cleanup, err := socketPath(deep, "uffd.sock")
	if err != nil {
		t.Fatal(err)
	}
	if len(p) > maxSocketPath {
		t.Fatalf("socket path %q is %d bytes", p, len(p))
	}
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatalf("listen on %s: %v", p, err)
	}
	defer ln.Close()
	// The socket lives in the deep directory itself.
	if fi, err := os.Lstat(filepath.Join(deep, "uffd.sock")); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("no socket in %s: %v", deep, err)
	}
	conn, err := net.Dial("unix", p)
	if err != nil {
		t.Fatalf("dial %s: %v", p, err)
	}
	conn.Close()
	cleanup()
	if _, err := os.Lstat(filepath.Dir(p)); !os.IsNotExist(err) {
		t.Fatalf("short link %s left after cleanup: %v", filepath.Dir(p), err)
	}
	short, cleanupShort, err := socketPath(t.TempDir(), "uffd.sock")
	if err != nil || filepath.Dir(short) == filepath.Dir(p) {
		t.Fatalf("short directory: %q, %v", short, err)
	}
	cleanupShort()
}

// linkChildEnv names, in the environment of TestSocketPathLinkChild, the
// directory whose short link the child makes before it is killed.
const linkChildEnv = "WARMSTART_TEST_LINK_CHILD_DIR"

// TestSocketPathLinkChild is not a test: run by
// TestSocketPathSweepsLinksOfKilledProcesses as a child of its own (with
// linkChildEnv set), it makes a short socket link, prints it and waits to
// be killed, as a restore killed with SIGKILL would.
func TestSocketPathLinkChild(t *testing.T) {
	dir := os.Getenv(linkChildEnv)
	if dir == "" {
		t.Skip("runs only as the child of TestSocketPathSweepsLinksOfKilledProcesses")
	}
	p, _, err := socketPath(dir, "uffd.sock")
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("link %s\n", filepath.Dir(p))
	io.Copy(io.Discard, os.Stdin) // until killed (or its parent is gone)
	os.Exit(1)
}

// TestSocketPathSweepsLinksOfKilledProcesses: a process killed in the
// middle of a restore leaks its short link; once the runtime directory it
// points at is gone, the next long socket path removes it. A link whose
// directory exists (another restore's, maybe of another process), an
// entry that is not a symlink, and a dangling symlink not named like a
// short link are left alone.
func TestSocketPathSweepsLinksOfKilledProcesses(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	deep := deepDir(t)
	killedDir := filepath.Join(deep, "killed")
	if err := os.Mkdir(killedDir, 0o700); err != nil {
		t.Fatal(err)
	}
	leaked := linkOfKilledChild(t, killedDir)
	if filepath.Dir(leaked) != tmp {
		t.Fatalf("short link %s made outside TMPDIR %s", leaked, tmp)
	}
	requireSymlink(t, leaked)

	// What the sweep must leave alone.
	liveDir := filepath.Join(deep, "live")
	if err := os.Mkdir(liveDir, 0o700); err != nil {
		t.Fatal(err)
	}
	live, cleanupLive, err := socketPath(liveDir, "uffd.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer cleanupLive()
	notALink := filepath.Join(tmp, "wsu-directory")
	if err := os.Mkdir(notALink, 0o700); err != nil {
		t.Fatal(err)
	}
	notALinkFile := filepath.Join(tmp, "wsu-file")
	if err := os.WriteFile(notALinkFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	otherDangling := filepath.Join(tmp, "other-link")
	if err := os.Symlink(filepath.Join(tmp, "gone"), otherDangling); err != nil {
		t.Fatal(err)
	}

	// The killed process's runtime directory still exists: its link is
	// not dangling, and is kept.
	_, cleanup, err := socketPath(filepath.Join(deep, "next"), "uffd.sock")
	if err != nil {
		t.Fatal(err)
	}
	cleanup()
	requireSymlink(t, leaked)

	// The runtime directory is removed, as the sweep of dead CLI
	// processes' directories does: the next call removes the link.
	if err := os.RemoveAll(killedDir); err != nil {
		t.Fatal(err)
	}
	_, cleanup, err = socketPath(filepath.Join(deep, "next"), "uffd.sock")
	if err != nil {
		t.Fatal(err)
	}
	cleanup()
	if _, err := os.Lstat(leaked); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dangling link %s of the killed process is still there (lstat: %v)", leaked, err)
	}
	requireSymlink(t, filepath.Dir(live))
	for _, p := range []string{notALink, notALinkFile, otherDangling} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}

// deepDir makes a directory under the test's temporary directory deep
// enough that a socket in it needs a short link.
func deepDir(t *testing.T) string {
	t.Helper()
	deep := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(deep, 0o700); err != nil {
		t.Fatal(err)
	}
	return deep
}

// linkOfKilledChild runs TestSocketPathLinkChild for dir, kills it with
// SIGKILL once it has made its short link, and returns that link.
func linkOfKilledChild(t *testing.T, dir string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSocketPathLinkChild$")
	cmd.Env = append(os.Environ(), linkChildEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, readErr := bufio.NewReader(stdout).ReadString('\n')
	cmd.Process.Kill()
	cmd.Wait()
	link, ok := strings.CutPrefix(strings.TrimSpace(line), "link ")
	if readErr != nil || !ok {
		t.Fatalf("child printed %q (%v), want its link", line, readErr)
	}
	return link
}

func requireSymlink(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("%s is not a symlink (%v, lstat: %v)", path, fi, err)
	}
}
