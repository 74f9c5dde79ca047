package initramfs

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/cavaliergopher/cpio"
)

type entry struct {
	mode cpio.FileMode
	data []byte
}

func readArchive(t *testing.T, r io.Reader) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	cr := cpio.NewReader(r)
	for {
		hdr, err := cr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("read archive: %v", err)
		}
		data, err := io.ReadAll(cr)
		if err != nil {
			t.Fatalf("read %s: %v", hdr.Name, err)
		}
		if _, dup := out[hdr.Name]; dup {
			t.Fatalf("entry %s appears twice", hdr.Name)
		}
		out[hdr.Name] = entry{mode: hdr.Mode, data: data}
	}
}

func TestWriteContents(t *testing.T) {
	agent := []byte("\x7fELF not really an agent")
	for _, compress := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "gzip"}[compress], func(t *testing.T) {
			var buf bytes.Buffer
			if err := Write(&buf, agent, compress); err != nil {
				t.Fatal(err)
			}
			var r io.Reader = &buf
			if compress {
				zr, err := gzip.NewReader(&buf)
				if err != nil {
					t.Fatalf("archive is not gzip: %v", err)
				}
				r = zr
			}
			got := readArchive(t, r)

			init, ok := got["init"]
			if !ok {
				t.Fatal("no init in archive")
			}
			if !init.mode.IsRegular() || init.mode.Perm() != 0o755 || !bytes.Equal(init.data, agent) {
				t.Errorf("init: mode %v, %d bytes; want regular 0755 with the agent's %d bytes", init.mode, len(init.data), len(agent))
			}
			for _, d := range []string{"dev", "proc", "sys", "etc/warmstart"} {
				if e, ok := got[d]; !ok || e.mode&cpio.ModeType != cpio.TypeDir {
					t.Errorf("%s: missing or not a directory (%v)", d, e.mode)
				}
			}
			for _, f := range DataFiles() {
				e, ok := got[f.Name[1:]]
				if !ok || !bytes.Equal(e.data, f.Data) {
					t.Errorf("data file %s missing or different", f.Name)
				}
			}
		})
	}
}

func TestWriteIsDeterministic(t *testing.T) {
	agent := bytes.Repeat([]byte{1, 2, 3}, 1000)
	var a, b bytes.Buffer
	if err := Write(&a, agent, false); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, agent, false); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two archives of the same agent differ")
	}
}

func TestWriteRejectsEmptyAgent(t *testing.T) {
	if err := Write(io.Discard, nil, false); err == nil {
		t.Fatal("Write accepted an empty agent")
	}
}

func TestDataFilesDiffer(t *testing.T) {
	seen := map[string]string{}
	var total int
	for _, f := range DataFiles() {
		key := string(f.Data[:min(len(f.Data), 64)])
		if other, dup := seen[key]; dup {
			t.Errorf("%s starts like %s: seeds collide", f.Name, other)
		}
		seen[key] = f.Name
		total += len(f.Data)
	}
	if total < 1<<20 {
		t.Errorf("data files hold %d bytes; the start-up set should be at least 1 MiB", total)
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if !isModuleRoot(root) {
		t.Fatalf("ModuleRoot returned %s, which is not the warmstart module root", root)
	}
}

func TestModulePath(t *testing.T) {
	for _, tc := range []struct{ gomod, want string }{
		{"module warmstart\n\ngo 1.26\n", "warmstart"},
		{"// comment\nmodule \"warmstart\"\n", "warmstart"},
		{"module example.com/other\n", "example.com/other"},
		{"go 1.26\n", ""},
	} {
		if got := modulePath([]byte(tc.gomod)); got != tc.want {
			t.Errorf("modulePath(%q) = %q, want %q", tc.gomod, got, tc.want)
		}
	}
}

// TestBuild compiles the real agent and checks the archive is cached by
// content: a second build returns the same file without rewriting it.
func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the agent; skipped in -short mode")
	}
	dir := t.TempDir()
	ctx := context.Background()
	p1, err := Build(ctx, Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	fi1, err := os.Stat(p1)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := Build(ctx, Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if p1 != p2 {
		t.Fatalf("two builds of the same source gave %s and %s", p1, p2)
	}
	fi2, err := os.Stat(p2)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(fi1, fi2) {
		t.Error("second build replaced the cached archive")
	}
	f, err := os.Open(p1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := readArchive(t, f)
	if !bytes.HasPrefix(got["init"].data, []byte("\x7fELF")) {
		t.Error("init is not an ELF binary")
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, "agent-*"))
	tmps, _ := filepath.Glob(filepath.Join(dir, ".initramfs-*"))
	if len(leftovers)+len(tmps) > 0 {
		t.Errorf("build left temporary files: %v %v", leftovers, tmps)
	}
}

func TestBuildPrebuiltAgent(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent")
	if err := os.WriteFile(agent, []byte("prebuilt"), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := Build(context.Background(), Options{CacheDir: filepath.Join(dir, "cache"), Agent: agent, Gzip: true})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Ext(p) != ".gz" {
		t.Errorf("gzip archive named %s", p)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if got := readArchive(t, zr)["init"].data; string(got) != "prebuilt" {
		t.Errorf("init holds %q, want the prebuilt agent", got)
	}
}
