package untrusted

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestOpenRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, fifo, dir, "/dev/zero"} {
		f, err := Open(p)
		if err == nil {
			f.Close()
			t.Errorf("Open(%s) succeeded", p)
			continue
		}
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("Open(%s) = %v, want ErrNotRegular", p, err)
		}
	}
	f, err := Open(file)
	if err != nil {
		t.Fatalf("Open(file): %v", err)
	}
	f.Close()
}

func TestReadBoundedRefusesLongFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 101), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadBounded(p, 100); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("ReadBounded over the limit = %v, want ErrTooLarge", err)
	}
	data, err := ReadBounded(p, 101)
	if err != nil || len(data) != 101 {
		t.Fatalf("ReadBounded at the limit = %d bytes, %v", len(data), err)
	}
}

func TestCheckOnDiskRefusesPseudoFileSystems(t *testing.T) {
	for _, path := range []string{"/proc/self/environ", "/sys/kernel/mm/transparent_hugepage/enabled"} {
		if _, err := os.Stat(path); err != nil {
			t.Logf("%s: %v (skipped)", path, err)
			continue
		}
		if err := CheckOnDisk(path); !errors.Is(err, ErrNotOnDisk) {
			t.Errorf("CheckOnDisk(%s) = %v, want ErrNotOnDisk", path, err)
		}
		if err := checkOpenOnDisk(t, path); !errors.Is(err, ErrNotOnDisk) {
			t.Errorf("CheckFileOnDisk(%s) = %v, want ErrNotOnDisk", path, err)
		}
	}
	file := filepath.Join(t.TempDir(), "vm_state.bin")
	if err := os.WriteFile(file, []byte("state"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckOnDisk(file); err != nil {
		t.Errorf("CheckOnDisk(a file in the test's directory) = %v", err)
	}
	if err := checkOpenOnDisk(t, file); err != nil {
		t.Errorf("CheckFileOnDisk(a file in the test's directory) = %v", err)
	}
}

func checkOpenOnDisk(t *testing.T, path string) error {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return CheckFileOnDisk(f)
}

func TestCheckCreatable(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CheckCreatable(filepath.Join(dir, "out.json")); err != nil {
		t.Fatalf("a new file in a writable directory: %v", err)
	}
	if err := CheckCreatable(file); err != nil {
		t.Fatalf("an existing file: %v", err)
	}
	for path, want := range map[string]string{
		filepath.Join(dir, "absent", "out.json"): "no such file",
		filepath.Join(file, "out.json"):          "not a directory",
		dir:                                      "is a directory",
	} {
		if err := CheckCreatable(path); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), path) {
			t.Errorf("CheckCreatable(%s) = %v, want an error naming it and %q", path, err, want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the probe left files behind: %v", ents)
	}
}

// OpenBeneath resolves every component beneath its directory: a
// symlink or ".." that leads out fails with ErrOutside, and the same way
// whatever is outside (a file, nothing, a FIFO), so the error tells
// nothing of it; symlinks that stay inside are followed.
func TestOpenBeneath(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	write := func(path string) {
		t.Helper()
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	symlink := func(target, path string) {
		t.Helper()
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "file"))
	write(filepath.Join(outside, "secret"))
	if err := syscall.Mkfifo(filepath.Join(outside, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	symlink(outside, filepath.Join(root, "abs"))
	symlink("../"+strings.Repeat("../", strings.Count(root, "/"))+outside, filepath.Join(root, "sub", "rel"))
	symlink("../file", filepath.Join(root, "sub", "inside"))
	for _, rel := range []string{"abs/secret", "abs/absent", "abs/fifo", "abs/secret/x", "sub/rel/secret", "../" + filepath.Base(root) + "/file", "sub/../../x"} {
		f, err := OpenBeneath(root, rel)
		if err == nil {
			f.Close()
		}
		if !errors.Is(err, ErrOutside) {
			t.Errorf("OpenBeneath(%s) = %v, want ErrOutside", rel, err)
		}
	}
	for _, rel := range []string{"file", "sub/inside"} {
		f, err := OpenBeneath(root, rel)
		if err != nil {
			t.Errorf("OpenBeneath(%s): %v", rel, err)
			continue
		}
		f.Close()
	}
	ln, err := net.Listen("unix", filepath.Join(root, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, rel := range []string{"sub", "sock"} {
		if f, err := OpenBeneath(root, rel); err == nil || !errors.Is(err, ErrNotRegular) {
			if err == nil {
				f.Close()
			}
			t.Errorf("OpenBeneath(%s) = %v, want ErrNotRegular", rel, err)
		}
	}
}
