package restore

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSocketPathWorksUnderADeepDirectory(t *testing.T) {
	deep := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(deep, 0o700); err != nil {
		t.Fatal(err)
	}
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
