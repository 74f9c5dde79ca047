package userfaultfd

import (
	"errors"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// unixPair is a connected pair of Unix stream sockets.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestHandshakeRoundTrip: what SendHandshake sends, ReceiveHandshake
// takes: the regions and a userfaultfd of the handler's own.
func TestHandshakeRoundTrip(t *testing.T) {
	fd, err := Open()
	if err != nil {
		t.Skipf("userfaultfd unusable here: %v", err)
	}
	defer unix.Close(fd)
	vmm, handler := unixPair(t)
	sent := []Mapping{
		{BaseHostVirtAddr: 0x7f0000000000, Size: 1 << 20, Offset: 0, PageSize: PageSizeBytes},
		{BaseHostVirtAddr: 0x7f0000200000, Size: 2 << 20, Offset: 2 << 20, PageSize: 2 << 20},
	}
	if err := SendHandshake(vmm, sent, fd); err != nil {
		t.Fatal(err)
	}
	got, gotFd, err := ReceiveHandshake(handler)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(gotFd)
	if len(got) != 2 || got[0] != sent[0] || got[1] != sent[1] || gotFd == fd {
		t.Fatalf("received %+v (fd %d), want %+v on a descriptor of its own", got, gotFd, sent)
	}
	if err := ValidateMappings(got, 4<<20); err != nil {
		t.Fatalf("regions inside a 4 MiB file: %v", err)
	}
	if err := ValidateMappings(got, 3<<20); !errors.Is(err, ErrBadHandshake) {
		t.Fatalf("regions past a 3 MiB file: %v, want ErrBadHandshake", err)
	}
}
