package userfaultfd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PageSizeBytes is the host base page size this package assumes.
const PageSizeBytes = 4096

// ErrUnsupported is wrapped when the kernel lacks a userfaultfd feature or
// ioctl that warmstart relies on.
var ErrUnsupported = errors.New("userfaultfd feature not supported")

// The userfaultfd ABI from include/uapi/linux/userfaultfd.h. golang.org/x/sys
// does not carry it. The layouts are checked against their C sizes in tests.

const (
	uffdAPI = 0xAA // UFFD_API

	featureEventRemove = 1 << 3 // UFFD_FEATURE_EVENT_REMOVE

	registerModeMissing = 1 << 0 // UFFDIO_REGISTER_MODE_MISSING
)

// CopyModeDontWake is UFFDIO_COPY_MODE_DONTWAKE: the copy leaves the
// threads that faulted on the range asleep, for one Wake over a run.
const CopyModeDontWake = 1 << 0

// Events a userfaultfd reports (uffd_msg.event).
const (
	EventPagefault = 0x12 // UFFD_EVENT_PAGEFAULT: Arg1 is the faulting address
	EventRemove    = 0x15 // UFFD_EVENT_REMOVE: [Arg0, Arg1) was discarded
)

// Ioctl command numbers within the 0xAA ("UFFDIO") type; bit i of the ioctls
// masks returned by UFFDIO_API and UFFDIO_REGISTER says command i exists.
const (
	nrRegister   = 0x00
	nrUnregister = 0x01
	nrWake       = 0x02
	nrCopy       = 0x03
	nrZeropage   = 0x04
	nrAPI        = 0x3F
)

// Linux's generic ioctl encoding (asm-generic/ioctl.h), used by x86 and arm64:
// dir<<30 | size<<16 | type<<8 | nr, with dir 1 = write, 2 = read.
const (
	iocWrite     = 1
	iocRead      = 2
	iocDirShift  = 30
	iocSizeShift = 16
	iocTypeShift = 8
	uffdioType   = 0xAA // UFFDIO
)

const (
	// UFFDIO_API = _IOWR(0xAA, 0x3F, struct uffdio_api /* 24 bytes */) = 0xC018AA3F
	ioctlAPI = (iocRead|iocWrite)<<iocDirShift | 24<<iocSizeShift | uffdioType<<iocTypeShift | nrAPI
	// UFFDIO_REGISTER = _IOWR(0xAA, 0x00, struct uffdio_register /* 32 bytes */) = 0xC020AA00
	ioctlRegister = (iocRead|iocWrite)<<iocDirShift | 32<<iocSizeShift | uffdioType<<iocTypeShift | nrRegister
	// UFFDIO_UNREGISTER = _IOR(0xAA, 0x01, struct uffdio_range /* 16 bytes */) = 0x8010AA01
	ioctlUnregister = iocRead<<iocDirShift | 16<<iocSizeShift | uffdioType<<iocTypeShift | nrUnregister
	// UFFDIO_WAKE = _IOR(0xAA, 0x02, struct uffdio_range /* 16 bytes */) = 0x8010AA02
	ioctlWake = iocRead<<iocDirShift | 16<<iocSizeShift | uffdioType<<iocTypeShift | nrWake
	// UFFDIO_COPY = _IOWR(0xAA, 0x03, struct uffdio_copy /* 40 bytes */) = 0xC028AA03
	ioctlCopy = (iocRead|iocWrite)<<iocDirShift | 40<<iocSizeShift | uffdioType<<iocTypeShift | nrCopy
	// UFFDIO_ZEROPAGE = _IOWR(0xAA, 0x04, struct uffdio_zeropage /* 32 bytes */) = 0xC020AA04
	ioctlZeropage = (iocRead|iocWrite)<<iocDirShift | 32<<iocSizeShift | uffdioType<<iocTypeShift | nrZeropage
)

// struct uffdio_api
type uffdioAPI struct {
	API      uint64
	Features uint64
	Ioctls   uint64
}

// struct uffdio_range
type uffdioRange struct {
	Start uint64
	Len   uint64
}

// struct uffdio_register
type uffdioRegister struct {
	Range  uffdioRange
	Mode   uint64
	Ioctls uint64
}

// struct uffdio_copy. Copy is written by the kernel: bytes copied, or a
// negative errno when nothing was.
type uffdioCopy struct {
	Dst  uint64
	Src  uint64
	Len  uint64
	Mode uint64
	Copy int64
}

// struct uffdio_zeropage
type uffdioZeropage struct {
	Range    uffdioRange
	Mode     uint64
	Zeropage int64
}

// MsgBytes is sizeof(struct uffd_msg): an 8-byte header (event, then
// reserved fields) and a 24-byte union. For PAGEFAULT the union holds flags,
// address, thread id; for REMOVE it holds start, end.
const MsgBytes = 32

// Msg is one struct uffd_msg read from a userfaultfd.
type Msg struct {
	Event      uint8
	Arg0, Arg1 uint64
}

// DecodeMsg decodes the uffd_msg at the start of m (MsgBytes long).
func DecodeMsg(m []byte) Msg {
	return Msg{Event: m[0], Arg0: binary.NativeEndian.Uint64(m[8:16]), Arg1: binary.NativeEndian.Uint64(m[16:24])}
}

// Open creates a userfaultfd the way Firecracker does for its Uffd backend:
// close-on-exec and non-blocking (a handler polls it, and poll on a blocking
// userfaultfd reports POLLERR), not restricted to user-mode faults (KVM faults
// guest memory from kernel mode), and with UFFD_FEATURE_EVENT_REMOVE so that
// the handler learns about pages the guest gives back with madvise.
//
// Creating a userfaultfd that handles kernel-mode faults needs
// CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1.
func Open() (fd int, err error) {
	r, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, uintptr(unix.O_CLOEXEC|unix.O_NONBLOCK), 0, 0)
	if errno != 0 {
		if errno == unix.EPERM {
			return -1, fmt.Errorf("userfaultfd: %w (needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1)", errno)
		}
		return -1, fmt.Errorf("userfaultfd: %w", errno)
	}
	fd = int(r)
	api := uffdioAPI{API: uffdAPI, Features: featureEventRemove}
	if err := ioctl(fd, ioctlAPI, unsafe.Pointer(&api)); err != nil {
		unix.Close(fd)
		if err == unix.EINVAL {
			return -1, fmt.Errorf("UFFDIO_API with EVENT_REMOVE: %w: %w", ErrUnsupported, err)
		}
		return -1, fmt.Errorf("UFFDIO_API: %w", err)
	}
	if api.Features&featureEventRemove == 0 {
		unix.Close(fd)
		return -1, fmt.Errorf("UFFDIO_API: %w: EVENT_REMOVE", ErrUnsupported)
	}
	const need = 1<<nrRegister | 1<<nrUnregister | 1<<nrAPI
	if api.Ioctls&need != need {
		unix.Close(fd)
		return -1, fmt.Errorf("UFFDIO_API: %w: ioctls %#x lack register/unregister", ErrUnsupported, api.Ioctls)
	}
	return fd, nil
}

// RegisterMissing registers [addr, addr+length) for MISSING faults: every
// access to a page not yet populated there blocks until the handler fills it.
func RegisterMissing(fd int, addr, length uintptr) error {
	if length == 0 || addr%PageSizeBytes != 0 || length%PageSizeBytes != 0 {
		return fmt.Errorf("register [%#x, +%#x): not page aligned or empty", addr, length)
	}
	reg := uffdioRegister{Range: uffdioRange{Start: uint64(addr), Len: uint64(length)}, Mode: registerModeMissing}
	if err := ioctl(fd, ioctlRegister, unsafe.Pointer(&reg)); err != nil {
		return fmt.Errorf("UFFDIO_REGISTER [%#x, +%#x): %w", addr, length, err)
	}
	// Hugetlbfs ranges offer no ZEROPAGE; the handler copies zeros there.
	const need = 1<<nrCopy | 1<<nrWake
	if reg.Ioctls&need != need {
		return fmt.Errorf("UFFDIO_REGISTER [%#x, +%#x): %w: range ioctls %#x lack copy/wake", addr, length, ErrUnsupported, reg.Ioctls)
	}
	return nil
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// Copy issues UFFDIO_COPY of length bytes from src to dst. It returns
// the bytes the kernel copied, which may be fewer than length with an error
// (EAGAIN for a partial copy, EEXIST when the first page is present).
// The caller keeps src alive across the call.
func Copy(fd int, dst, src uintptr, length uint64, mode uint64) (uint64, error) {
	c := uffdioCopy{Dst: uint64(dst), Src: uint64(src), Len: length, Mode: mode}
	err := ioctl(fd, ioctlCopy, unsafe.Pointer(&c))
	if c.Copy > 0 {
		return uint64(c.Copy), err
	}
	return 0, err
}

// ZeroPage maps the zero page over [dst, dst+length).
func ZeroPage(fd int, dst uintptr, length uint64, mode uint64) (uint64, error) {
	z := uffdioZeropage{Range: uffdioRange{Start: uint64(dst), Len: length}, Mode: mode}
	err := ioctl(fd, ioctlZeropage, unsafe.Pointer(&z))
	if z.Zeropage > 0 {
		return uint64(z.Zeropage), err
	}
	return 0, err
}

// Wake wakes the threads blocked on faults in [start, start+length).
func Wake(fd int, start uintptr, length uint64) error {
	r := uffdioRange{Start: uint64(start), Len: length}
	return ioctl(fd, ioctlWake, unsafe.Pointer(&r))
}
