package fusedev

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/hungtest"
)

// A server whose lower stopped answering a read still closes within its
// bound, saying why, once the reader is gone (the VMM killed): it does
// not wait for the storage. The handler left in the read ends when the
// storage answers.
func TestCloseIsBoundedWhileTheLowerHangs(t *testing.T) {
	const size = 1 << 20
	srv, err := Mount(filepath.Join(t.TempDir(), "mnt"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	lower := hungtest.NewLower(size)
	t.Cleanup(lower.Release)
	d, err := srv.Attach("hung", lowerReq("hung-1", func() (memdev.Lower, error) { return lower, nil }, memdev.IOEngineBuffered))
	if err != nil {
		t.Fatal(err)
	}
	reader := startChild(t, childSpec{Mode: childRead, Path: d.Path(), Layout: layout.Single(size), Pages: []int64{0}})
	select {
	case <-lower.Entered():
	case <-time.After(resultTimeout):
		t.Fatal("the reader's read never reached the lower")
	}
	reader.cmd.Process.Kill()
	reader.cmd.Wait()
	closeWait = 100 * time.Millisecond
	t.Cleanup(func() { closeWait = defaultCloseWait })
	closed := make(chan error, 1)
	go func() { closed <- srv.Close() }()
	select {
	case err := <-closed:
		if err == nil || !strings.Contains(err.Error(), "still in a read of the memory source") {
			t.Errorf("Close = %v, want an error naming the read left behind", err)
		}
	case <-time.After(resultTimeout):
		lower.Release()
		t.Fatalf("Close still waiting %v after the reader was killed: it waits for the storage", resultTimeout)
	}
	if _, mounted, _ := mountTypeAt(srv.Dir()); mounted {
		t.Errorf("%s still mounted after Close", srv.Dir())
	}
}
