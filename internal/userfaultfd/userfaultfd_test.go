package userfaultfd

import (
	"os"
	"testing"
	"unsafe"

	"warmstart/internal/reexec"
)

func TestMain(m *testing.M) {
	reexec.Roles{roleCheckAsOther: runCheckAvailable}.Dispatch()
	os.Exit(m.Run())
}

func TestABIMatchesKernelHeaders(t *testing.T) {
	sizes := []struct {
		name      string
		got, want uintptr
	}{
		{"uffdio_api", unsafe.Sizeof(uffdioAPI{}), 24},
		{"uffdio_range", unsafe.Sizeof(uffdioRange{}), 16},
		{"uffdio_register", unsafe.Sizeof(uffdioRegister{}), 32},
		{"uffdio_copy", unsafe.Sizeof(uffdioCopy{}), 40},
		{"uffdio_zeropage", unsafe.Sizeof(uffdioZeropage{}), 32},
	}
	for _, s := range sizes {
		if s.got != s.want {
			t.Errorf("sizeof(%s) = %d, want %d", s.name, s.got, s.want)
		}
	}
	// Values as printed by a C program including <linux/userfaultfd.h>.
	ioctls := []struct {
		name      string
		got, want uintptr
	}{
		{"UFFDIO_API", ioctlAPI, 0xC018AA3F},
		{"UFFDIO_REGISTER", ioctlRegister, 0xC020AA00},
		{"UFFDIO_UNREGISTER", ioctlUnregister, 0x8010AA01},
		{"UFFDIO_WAKE", ioctlWake, 0x8010AA02},
		{"UFFDIO_COPY", ioctlCopy, 0xC028AA03},
		{"UFFDIO_ZEROPAGE", ioctlZeropage, 0xC020AA04},
	}
	for _, c := range ioctls {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}
