package qemu

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"warmstart/internal/reexec"

	"golang.org/x/sys/unix"
)

// Why QEMU is started through a launcher.
//
// QEMU advises all guest RAM MADV_HUGEPAGE. On a file mapping that sets
// VM_HUGEPAGE, and for such a mapping the kernel's fault path (6.x
// do_sync_mmap_readahead) reads a 2 MiB-aligned block, usually two, around
// every page fault, whatever the backing device's readahead window says. A
// restore through the FUSE device then reads tens of MiB for a guest that
// touches a couple, and the recorder's one-page tracing mount records those
// blocks rather than the pages the guest touched. Firecracker's File
// backend gives no such advice, so this driver would misstate the fault
// pattern warmstart is built around.
//
// prctl(PR_SET_THP_DISABLE) does not help: it only makes huge pages
// ineligible (THPeligible 0), madvise still sets VM_HUGEPAGE and the
// readahead still follows it (measured on a 128 KiB-readahead mount: 4 MiB
// read for one touched page, with and without the prctl). So the launcher
// installs a seccomp filter that fails madvise(MADV_HUGEPAGE) with EINVAL,
// which QEMU ignores, and then replaces itself with QEMU. The filter and
// PR_SET_NO_NEW_PRIVS carry across execve, and so does the parent-death
// signal the driver sets on the launcher: QEMU runs in the launcher's
// process, with its pid.

// Roles of this executable, chosen by reexec.Env.
const (
	// RoleLauncher makes the executable QEMU's launcher: argv[1] is QEMU's
	// binary and the rest its arguments.
	RoleLauncher = "qemu-launcher"
)

// selfExe names the launcher: the executable running the driver. In the
// forked child it still names the parent's executable, even one whose file
// has since been replaced or removed.
const selfExe = "/proc/self/exe"

// launcherArgv0 is the launcher's argv[0], for ps and logs until it execs.
const launcherArgv0 = "warmstart-qemu-launcher"

// launcherFailedStatus is the launcher's exit status when it could not
// start QEMU; the reason goes to standard error, which is QEMU's log.
const launcherFailedStatus = 125

// LauncherMain is QEMU's launcher: the entry point of role RoleLauncher,
// which every executable that starts QEMU through this driver lists in
// the roles its main (and TestMain) dispatches; one that does not exits
// at once naming the missing role. It returns only if QEMU could not be
// started.
func LauncherMain() int {
	err := launch(os.Args[1:])
	fmt.Fprintf(os.Stderr, "qemu launcher: %v\n", err)
	return launcherFailedStatus
}

// launch denies huge-page advice and replaces the process with argv. It
// returns only on error.
func launch(argv []string) error {
	if len(argv) == 0 {
		return errors.New("no program to run")
	}
	// The filter and the exec must happen on the same thread; the thread is
	// never unlocked because the process either execs or exits.
	runtime.LockOSThread()
	if err := denyHugePageAdvice(); err != nil {
		return err
	}
	env := reexec.Without(os.Environ())
	if err := syscall.Exec(argv[0], argv, env); err != nil {
		return fmt.Errorf("exec %s: %w", argv[0], err)
	}
	return nil
}

// launcherCommand is the path, argv and environment that start binary with
// args through the launcher.
func launcherCommand(binary string, args []string) (path string, argv, env []string) {
	argv = append([]string{launcherArgv0, binary}, args...)
	env = reexec.Environ(os.Environ(), RoleLauncher)
	return selfExe, argv, env
}

// Offsets in struct seccomp_data, which a filter loads from.
const (
	seccompDataNr   = 0
	seccompDataArch = 4
	// seccompDataArg2Low is the low 32 bits of args[2] (args start at 16,
	// eight bytes each; little-endian).
	seccompDataArg2Low = 16 + 2*8
)

// auditArch is the AUDIT_ARCH value of this executable's syscalls.
func auditArch() (uint32, error) {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64, nil
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64, nil
	}
	return 0, fmt.Errorf("no seccomp architecture for GOARCH %s", runtime.GOARCH)
}

// hugePageFilter is a seccomp program that fails madvise(…, MADV_HUGEPAGE)
// with EINVAL and allows everything else, including syscalls of another
// architecture: it changes one behaviour, it is not a sandbox.
func hugePageFilter(arch uint32) []unix.SockFilter {
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jeq := func(k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: jt, Jf: jf, K: k}
	}
	const load = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	return []unix.SockFilter{
		/* 0 */ stmt(load, seccompDataArch),
		/* 1 */ jeq(arch, 0, 5), // other arch → 7
		/* 2 */ stmt(load, seccompDataNr),
		/* 3 */ jeq(unix.SYS_MADVISE, 0, 3), // other syscall → 7
		/* 4 */ stmt(load, seccompDataArg2Low),
		/* 5 */ jeq(unix.MADV_HUGEPAGE, 0, 1), // other advice → 7
		/* 6 */ stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ERRNO|uint32(unix.EINVAL)&unix.SECCOMP_RET_DATA),
		/* 7 */ stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ALLOW),
	}
}

// denyHugePageAdvice makes madvise(MADV_HUGEPAGE) fail with EINVAL in
// every thread of this process and in whatever it execs. It sets
// PR_SET_NO_NEW_PRIVS, which an unprivileged filter requires.
func denyHugePageAdvice() error {
	arch, err := auditArch()
	if err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	prog := hugePageFilter(arch)
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// TSYNC gives every thread the filter; it fails with the id of a
	// thread it could not synchronise.
	tid, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("install seccomp filter: %w", errno)
	}
	if tid != 0 {
		return fmt.Errorf("install seccomp filter: thread %d could not take it", tid)
	}
	return nil
}
