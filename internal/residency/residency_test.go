package residency

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

const testPages = 256

// mappedFile writes a file of testPages pages, drops it from the page
// cache, and maps it privately into this process, as a VMM maps guest
// memory from the file device.
func mappedFile(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "memory.bin")
	data := make([]byte, testPages*PageBytes)
	for i := range data {
		data[i] = byte(i/PageBytes + 1)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, len(data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return path, mem
}

func TestWrittenPagesAreExactlyTheTouchedOnes(t *testing.T) {
	path, mem := mappedFile(t)
	written := []int64{3, 100, 200}
	for _, p := range written {
		mem[p*PageBytes+7] = 0xaa // a store faults for write and copies the page: no fault-around
	}
	pages, err := Of(os.Getpid(), path, testPages*PageBytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range written {
		if touched, known := pages.Touched(p); !touched || !known {
			t.Errorf("page %d: touched=%v known=%v, want touched", p, touched, known)
		}
	}
	if n := pages.Count(); n != int64(len(written)) {
		t.Errorf("%d pages mapped, want exactly the %d written", n, len(written))
	}
}

func TestReadPagesAreTouchedAndFarPagesAreNot(t *testing.T) {
	path, mem := mappedFile(t)
	if mem[120*PageBytes] != 121 {
		t.Fatal("read the wrong page content")
	}
	pages, err := Of(os.Getpid(), path, testPages*PageBytes)
	if err != nil {
		t.Fatal(err)
	}
	if touched, _ := pages.Touched(120); !touched {
		t.Error("page 120 was read but is not reported touched")
	}
	// Fault-around maps at most a 64 KiB window around the faulting page.
	for _, far := range []int64{0, 60, 200, testPages - 1} {
		if touched, known := pages.Touched(far); touched || !known {
			t.Errorf("page %d far from the read: touched=%v known=%v", far, touched, known)
		}
	}
	if _, known := pages.Touched(testPages); known {
		t.Error("a page beyond the file is reported known")
	}
}

func TestAFileTheProcessDoesNotMapIsAnError(t *testing.T) {
	other := filepath.Join(t.TempDir(), "other.bin")
	if err := os.WriteFile(other, make([]byte, PageBytes), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Of(os.Getpid(), other, PageBytes); !errors.Is(err, ErrNotMapped) {
		t.Fatalf("err = %v, want ErrNotMapped", err)
	}
	if _, err := Of(os.Getpid(), filepath.Join(t.TempDir(), "missing"), PageBytes); err == nil {
		t.Fatal("a missing file is not an error")
	}
}

func TestParseMapsLine(t *testing.T) {
	dev := unix.Mkdev(0, 0x2f)
	good := "7f0000000000-7f0000004000 rw-p 00002000 00:2f 1234   /run/ws/mem"
	m, ok, err := parseMapsLine(good, dev, 1234)
	if err != nil || !ok || m.start != 0x7f0000000000 || m.end != 0x7f0000004000 || m.fileOffset != 0x2000 {
		t.Fatalf("good line: %+v %v %v", m, ok, err)
	}
	if _, ok, err := parseMapsLine(good, dev, 99); ok || err != nil {
		t.Fatalf("other inode: ok=%v err=%v", ok, err)
	}
	if _, ok, err := parseMapsLine(good, unix.Mkdev(8, 1), 1234); ok || err != nil {
		t.Fatalf("other device: ok=%v err=%v", ok, err)
	}
	for _, bad := range []string{"", "7f-7e rw-p 0 00:2f 1234", "zz-7f rw-p 0 00:2f 1234", "1-2 rw-p 0 00:2f x", "1-2 rw-p 0 0x2f 1234"} {
		if _, ok, err := parseMapsLine(bad, dev, 1234); err == nil && ok {
			t.Errorf("bad line %q accepted", bad)
		}
	}
}

// BenchmarkOf128MiB reads the residency of a 128 MiB private mapping,
// the reference guest's size.
func BenchmarkOf128MiB(b *testing.B) {
	const size = 128 << 20
	path := filepath.Join(b.TempDir(), "memory.bin")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(mem)
	for i := 0; i < size; i += 64 * PageBytes {
		mem[i] = 1
	}
	for b.Loop() {
		if _, err := Of(os.Getpid(), path, size); err != nil {
			b.Fatal(err)
		}
	}
}
