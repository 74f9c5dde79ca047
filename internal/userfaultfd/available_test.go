package userfaultfd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/reexec"
)

// TestCheckAvailable: this host's tests create userfaultfds themselves, so
// a VMM started by them can too.
func TestCheckAvailable(t *testing.T) {
	if _, err := Open(); err != nil {
		t.Skipf("userfaultfd unusable here: %v", err)
	}
	if err := CheckAvailable(); err != nil {
		t.Fatalf("CheckAvailable: %v, though this process creates userfaultfds", err)
	}
}

// TestUnavailableNamesTheFix: each way the system call fails is explained
// with what would make it work.
func TestUnavailableNamesTheFix(t *testing.T) {
	noDevice := fmt.Errorf("open %s: %w", DevicePath, fs.ErrNotExist)
	denied := fmt.Errorf("open %s: %w", DevicePath, fs.ErrPermission)
	for _, c := range []struct {
		name   string
		errno  syscall.Errno
		devErr error
		want   []string
		not    []string
	}{
		{"no syscall", unix.ENOSYS, noDevice, []string{"CONFIG_USERFAULTFD"}, nil},
		{"unprivileged, before 6.1", unix.EPERM, noDevice, []string{"root", "CAP_SYS_PTRACE", "vm.unprivileged_userfaultfd=1"}, []string{"setfacl"}},
		{"unprivileged, device not accessible", unix.EPERM, denied, []string{"root", "vm.unprivileged_userfaultfd=1", "setfacl -m u:$USER:rw " + DevicePath}, nil},
		{"other", unix.EMFILE, noDevice, []string{"userfaultfd", unix.EMFILE.Error()}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := unavailable(c.errno, c.devErr)
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("%v is not ErrUnavailable", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not name %q", err, w)
				}
			}
			for _, n := range c.not {
				if strings.Contains(err.Error(), n) {
					t.Errorf("%q names %q, which does not apply", err, n)
				}
			}
		})
	}
}

// roleCheckAsOther runs CheckAvailable and prints its error.
const roleCheckAsOther = "test-uffd-check-available"

func runCheckAvailable() int {
	if err := CheckAvailable(); err != nil {
		fmt.Print(err)
		return 1
	}
	return 0
}

// TestCheckAvailableUnprivileged runs CheckAvailable as an unprivileged
// user (nobody), as a VMM started by a warmstart that is not root would
// run: on a host that keeps userfaultfd from such a user (the default
// vm.unprivileged_userfaultfd=0, /dev/userfaultfd root's alone) it must
// fail and say how to allow it.
func TestCheckAvailableUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a process as another user")
	}
	const nobody = 65534
	// /proc/self/exe is this test binary, wherever its directory is and
	// whoever may search it.
	cmd := exec.Command("/proc/self/exe")
	cmd.Dir = "/"
	cmd.Env = reexec.Environ(os.Environ(), roleCheckAsOther)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	out, err := cmd.Output()
	var exit *exec.ExitError
	switch {
	case err == nil && unprivilegedAllowed(t, nobody):
		t.Logf("userfaultfd is allowed for uid %d here", nobody)
	case err == nil:
		t.Fatalf("CheckAvailable as uid %d succeeded, though this host does not let it create userfaultfds", nobody)
	case !errors.As(err, &exit):
		t.Skipf("cannot run this test binary as uid %d: %v", nobody, err)
	case unprivilegedAllowed(t, nobody):
		t.Fatalf("CheckAvailable as uid %d: %s, though this host lets it create userfaultfds", nobody, out)
	default:
		for _, w := range []string{"userfaultfd unavailable", "root", "vm.unprivileged_userfaultfd=1"} {
			if !strings.Contains(string(out), w) {
				t.Errorf("CheckAvailable as uid %d: %q does not name %q", nobody, out, w)
			}
		}
		t.Logf("as uid %d: %s", nobody, out)
	}
}

// unprivilegedAllowed reports whether this host lets uid create
// userfaultfds: through the sysctl, or /dev/userfaultfd open to all.
func unprivilegedAllowed(t *testing.T, uid int) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd")
	if err == nil && strings.TrimSpace(string(data)) == "1" {
		return true
	}
	st, err := os.Stat(DevicePath)
	if err != nil {
		return false
	}
	owner := int(st.Sys().(*syscall.Stat_t).Uid)
	return st.Mode().Perm()&0o006 == 0o006 || owner == uid && st.Mode().Perm()&0o600 == 0o600
}
