package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSocketPathNoClientCanReachIsRefused: the socket is bound at a short
// temporary path and linked into place, so a [daemon] socket longer than
// a Unix socket address holds was served, yet every client's connect
// failed ("invalid argument", reported as no daemon answering). Such a
// path is refused at start, naming its length and the limit.
func TestSocketPathNoClientCanReachIsRefused(t *testing.T) {
	dir := t.TempDir()
	long := filepath.Join(dir, strings.Repeat("x", socketPathLimit-len(dir))+".sock")
	ln, _, err := listenPrivate(long)
	if err == nil {
		ln.Close()
		t.Fatalf("listen on a %d-byte socket path: no error; want a refusal (a client connects to at most %d bytes)",
			len(long), socketPathLimit)
	}
	if !strings.Contains(err.Error(), long) || !strings.Contains(err.Error(), "107") {
		t.Errorf("listen on a %d-byte socket path: %v; want an error naming the path and the limit", len(long), err)
	}
	if _, statErr := os.Lstat(long); statErr == nil {
		t.Errorf("a refused socket path exists: %s", long)
	}
}
