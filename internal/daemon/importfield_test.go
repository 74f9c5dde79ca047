package daemon_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"warmstart/internal/api"
)

// An import whose publish refuses a file the daemon's own checks passed
// (here the vm state, emptied between the check and the publish) is a 400
// that names the field the file came in, as every 400 does.
func TestImportRefusedAtPublishNamesTheField(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	vmState := filepath.Join(f.dir, "vm-state.bin")
	data, err := os.ReadFile(f.ref.VMState)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(vmState, data, 0o644); err != nil {
		t.Fatal(err)
	}
	// The daemon checks vm_state, then opens memory: hold that open until
	// the vm state is emptied, so the publish finds it so.
	onOpen(t, f.ref.Memory, func() {
		if err := os.Truncate(vmState, 0); err != nil {
			t.Error(err)
		}
	})
	r := startDaemon(t, f, nil)
	req := f.importRequest("")
	req.VMState = vmState
	_, err = r.client.Import(context.Background(), req)
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest || ae.Field != "vm_state" {
		t.Fatalf("import = %v (%+v), want a 400 on vm_state", err, ae)
	}
}

// onOpen calls first, once, when path is first opened, before the open
// returns (a fanotify permission event); every open is then allowed.
func onOpen(t *testing.T, path string, first func()) {
	t.Helper()
	fd, err := unix.FanotifyInit(unix.FAN_CLASS_CONTENT|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		t.Fatalf("fanotify: %v", err)
	}
	if err := unix.FanotifyMark(fd, unix.FAN_MARK_ADD, unix.FAN_OPEN_PERM, unix.AT_FDCWD, path); err != nil {
		unix.Close(fd)
		t.Fatalf("fanotify mark %s: %v", path, err)
	}
	fan := os.NewFile(uintptr(fd), "fanotify")
	done := make(chan struct{})
	t.Cleanup(func() {
		fan.Close() // the kernel allows what is still pending
		<-done
	})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		called := false
		for {
			n, err := fan.Read(buf)
			if err != nil {
				if !errors.Is(err, os.ErrClosed) && !errors.Is(err, io.EOF) {
					t.Errorf("fanotify read: %v", err)
				}
				return
			}
			for ev := buf[:n]; len(ev) >= int(unsafe.Sizeof(unix.FanotifyEventMetadata{})); {
				m := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&ev[0]))
				if !called {
					called = true
					first()
				}
				resp := make([]byte, 8)
				binary.NativeEndian.PutUint32(resp, uint32(m.Fd))
				binary.NativeEndian.PutUint32(resp[4:], unix.FAN_ALLOW)
				if _, err := fan.Write(resp); err != nil {
					t.Errorf("fanotify allow: %v", err)
				}
				unix.Close(int(m.Fd))
				ev = ev[m.Event_len:]
			}
		}
	}()
}
