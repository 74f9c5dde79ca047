package daemon

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRuntimeDirShareWithOthersIsRefusedNotTaken: a runtime directory
// others can enter is tightened to 0700 only when it is plainly the
// daemon's own. One that is shared (sticky, as /tmp is; holding another
// user's files, as /home does; the file system's root) is refused as it
// is: a daemon pointed at "/tmp" by mistake must not take /tmp from every
// other user of the host. A tmpfs mounted for the daemon is sticky too,
// but holds nothing else: it is tightened.
func TestRuntimeDirShareWithOthersIsRefusedNotTaken(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to give a file to another user")
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sticky := filepath.Join(t.TempDir(), "tmp")
	if err := os.Mkdir(sticky, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(sticky, ".X11-unix"), 0o700); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(t.TempDir(), "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(home, "alice"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(home, "alice"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{sticky: "sticky", home: "uid 65534"} {
		before, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		err = privateRuntimeDir(dir, log)
		if err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), want) {
			t.Errorf("runtime directory %s: %v; want a refusal naming it and %q", dir, err, want)
		}
		after, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if after.Mode() != before.Mode() {
			t.Errorf("runtime directory %s: mode %v became %v; a refused directory keeps its mode", dir, before.Mode(), after.Mode())
		}
	}
	// The daemon's own: left by an older build (0755), and a tmpfs just
	// mounted for it (sticky 01777, holding only what warmstart puts there).
	own := filepath.Join(t.TempDir(), "run")
	fresh := filepath.Join(t.TempDir(), "tmpfs")
	for dir, mode := range map[string]os.FileMode{own: 0o755, fresh: 0o777 | os.ModeSticky} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(fresh, "daemon"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{own, fresh} {
		if err := privateRuntimeDir(dir, log); err != nil {
			t.Fatalf("the daemon's own runtime directory %s: %v; want it tightened", dir, err)
		}
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("the daemon's own runtime directory %s after the start: %v, %v; want mode 0700", dir, fi.Mode(), err)
		}
	}
}
