package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/api"
)

// An import that shutdown cuts short answers 503 (the daemon is shutting
// down, try another), as a restore does, not a 500, and leaves nothing in
// the store.
func TestImportCutByShutdownIs503(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	memory := filepath.Join(f.dir, "big-memory.bin")
	if err := os.WriteFile(memory, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Sparse and large: the copy, its fsync and its read-back outlast the
	// shutdown grace by far.
	if err := os.Truncate(memory, 4<<30); err != nil {
		t.Fatal(err)
	}
	opts := f.options(t)
	opts.ShutdownGrace = 50 * time.Millisecond
	d, served := serveInBackground(t, opts)
	client := api.NewClient(d.Endpoint())
	defer client.Close()
	imported := make(chan error, 1)
	go func() {
		_, err := client.Import(context.Background(), api.ImportRequest{VMState: f.ref.VMState, Memory: memory})
		imported <- err
	}()
	waitForTempMemory(t, filepath.Join(f.dir, "store", "snapshots"))
	shutDown(t, d, served)
	err := <-imported
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("import cut by shutdown: %v, want HTTP 503", err)
	}
	if left, _ := filepath.Glob(filepath.Join(f.dir, "store", "snapshots", "*")); len(left) > 0 {
		t.Errorf("left in the store: %v", left)
	}
}

// waitForTempMemory waits until an import has begun copying a memory file
// below snapshots (the copy is then in progress), told by inotify: the
// import creates the snapshot's directory, then the temporary file in it.
func waitForTempMemory(t *testing.T, snapshots string) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, snapshots, unix.IN_CREATE); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		// Watch every snapshot directory there is, then look: a file
		// created after the look raises an event on a watched directory.
		dirs, _ := filepath.Glob(filepath.Join(snapshots, "*"))
		for _, dir := range dirs {
			unix.InotifyAddWatch(fd, dir, unix.IN_CREATE)
		}
		if m, _ := filepath.Glob(filepath.Join(snapshots, "*", ".memory.bin.*")); len(m) > 0 {
			return
		}
		if _, err := unix.Read(fd, buf); err != nil && err != unix.EINTR {
			t.Fatal(err)
		}
	}
}
