package posixfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/repository/repotest"
)

// TestStoreOnAReadOnlyMount: a store opened for writing on a read-only
// mount (a read-only bind mount here) lists, resolves and leases nothing
// new; every change fails with an error that matches EROFS and names the
// store, and the open does not warn that its sweep could not write.
func TestStoreOnAReadOnlyMount(t *testing.T) {
	w := openTemp(t, Options{})
	rec, lease := repotest.Publish(t, w, "web")
	lease.End()
	ro := filepath.Join(t.TempDir(), "ro")
	if err := os.Mkdir(ro, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(w.Root(), ro, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v (a read-only store needs a mount of its own)", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(ro, 0); err != nil {
			t.Errorf("unmount %s: %v", ro, err)
		}
	})
	if err := unix.Mount("", ro, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Skipf("remount read-only: %v", err)
	}
	var warned []error
	r, err := Open(ro, Options{Warn: func(err error) { warned = append(warned, err) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(warned) != 0 {
		t.Errorf("opening a store on a read-only mount warned: %v", warned)
	}
	if got, err := r.Lookup(bg(), "web"); err != nil || got.ID != rec.ID {
		t.Fatalf("Lookup(web) = %v, %v", got.ID, err)
	}
	wantReadOnly := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, syscall.EROFS) || !strings.Contains(err.Error(), "snapshot store "+ro) {
			t.Errorf("%s on a read-only mount = %v; want EROFS naming the store %s", what, err, ro)
		}
	}
	_, err = r.BeginCapture(bg())
	wantReadOnly("BeginCapture", err)
	wantReadOnly("Delete", r.Delete(bg(), rec.ID))
}
