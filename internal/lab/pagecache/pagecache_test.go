package pagecache

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
)

func writeRandom(t *testing.T, path string, size int) []byte {
	t.Helper()
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return data
}

func TestCopyVerifiedThenEvict(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	data := writeRandom(t, src, 1<<20+123)
	dst := filepath.Join(dir, "dst")
	sum, err := CopyVerified(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := HashFile(src); sum != want {
		t.Fatalf("digest %s, want %s", sum, want)
	}
	got, _ := os.ReadFile(dst)
	if !bytes.Equal(got, data) {
		t.Fatal("copy differs from source")
	}
	r, err := Probe(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Full() || r.Total != int64((len(data)+os.Getpagesize()-1)/os.Getpagesize()) {
		t.Fatalf("after verified copy: %v, want all resident", r)
	}
	if err := Evict(dst); err != nil {
		t.Fatal(err)
	}
	r, err = Probe(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !r.None() {
		t.Fatalf("after evict: %v, want none resident", r)
	}
	// Eviction is private to the file: the source keeps its pages.
	if _, err := HashFile(src); err != nil {
		t.Fatal(err)
	}
	if r, _ := Probe(src); !r.Full() {
		t.Fatalf("source after evicting the copy: %v", r)
	}
}

func TestProbeErrors(t *testing.T) {
	if _, err := Probe(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("probe of a missing file succeeded")
	}
	if _, err := CopyVerified(filepath.Join(t.TempDir(), "missing"), filepath.Join(t.TempDir(), "x")); err == nil {
		t.Fatal("copy of a missing file succeeded")
	}
}
