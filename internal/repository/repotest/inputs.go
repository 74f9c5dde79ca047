// Package repotest is the behaviour suite of the repository contract. Every
// backend's tests call Run with a function that opens a fresh, empty
// repository, and RunCrossProcess for the behaviours that must hold
// between processes (child.go runs the child processes); backend-specific
// tests (crashes, killed lock holders, on-disk layout) live with the
// backend and use the helpers here.
package repotest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/repository"
)

// Inputs are the artifact files of one capture, as a VMM would leave them.
type Inputs struct {
	VMStatePath, MemoryPath     string
	Layout                      layout.Layout
	VMStateSHA256, MemorySHA256 string
	VMStateSize, MemorySize     int64
}

// VMStateBytes is the size of the VM state file NewInputs writes.
const VMStateBytes = 3000

// NewInputs writes a VM state file and a memory file of memBytes (a
// multiple of 4 KiB) with random contents into a fresh temporary directory.
func NewInputs(t testing.TB, memBytes int64) Inputs {
	t.Helper()
	return NewInputsIn(t, t.TempDir(), memBytes)
}

// NewInputsIn is NewInputs writing into dir.
func NewInputsIn(t testing.TB, dir string, memBytes int64) Inputs {
	t.Helper()
	in := Inputs{
		VMStatePath: filepath.Join(dir, "vmstate"),
		MemoryPath:  filepath.Join(dir, "memory"),
		Layout:      layout.Single(memBytes),
		VMStateSize: VMStateBytes,
		MemorySize:  memBytes,
	}
	in.VMStateSHA256 = writeRandom(t, in.VMStatePath, VMStateBytes)
	in.MemorySHA256 = writeRandom(t, in.MemoryPath, memBytes)
	return in
}

// Request is the PublishRequest for these inputs.
func (in Inputs) Request(alias string) repository.PublishRequest {
	return repository.PublishRequest{VMStatePath: in.VMStatePath, MemoryPath: in.MemoryPath, Layout: in.Layout, Alias: alias}
}

func writeRandom(t testing.TB, path string, n int64) string {
	t.Helper()
	data := make([]byte, n)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return SHA256Hex(data)
}

// SHA256Hex is the lowercase hex SHA-256 of data.
func SHA256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// FileSHA256 is the lowercase hex SHA-256 of the file at path.
func FileSHA256(t testing.TB, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return SHA256Hex(data)
}

// SmallMemoryBytes keeps most tests fast; LargeMemoryBytes spans several
// copy buffers.
const (
	SmallMemoryBytes = 64 << 10
	LargeMemoryBytes = 5<<20 + 4096
)

// Publish captures and publishes fresh inputs under alias and returns the
// record with its lease still held; the lease ends when the test does.
func Publish(t testing.TB, repo repository.Repository, alias string) (repository.Record, repository.Lease) {
	t.Helper()
	return PublishInputs(t, repo, NewInputs(t, SmallMemoryBytes), alias)
}

// PublishInputs is Publish of the given inputs.
func PublishInputs(t testing.TB, repo repository.Repository, in Inputs, alias string) (repository.Record, repository.Lease) {
	t.Helper()
	ctx := context.Background()
	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		t.Fatalf("BeginCapture: %v", err)
	}
	t.Cleanup(func() { _ = lease.End() })
	rec, err := repo.Publish(ctx, lease, in.Request(alias))
	if err != nil {
		t.Fatalf("Publish(alias %q): %v", alias, err)
	}
	return rec, lease
}

// ManifestBytes returns distinct stand-in manifest contents; the repository
// stores manifests as opaque bytes.
func ManifestBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// FlipBytes changes the byte at each offset of the file at path in place
// (one bit inverted), as bit rot or a stray write would. Stored artifacts
// are read-only; the owner's write bit is set for the write and cleared
// again.
func FlipBytes(t testing.TB, path string, offsets ...int64) {
	t.Helper()
	for _, off := range offsets {
		xorAt(t, path, off, []byte{0x10})
	}
}

// xorAt XORs mask into the file at path from off, in place, setting the
// owner's write bit for the write as FlipBytes does.
func xorAt(t testing.TB, path string, off int64, mask []byte) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, fi.Mode().Perm()|0o200); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(path, fi.Mode().Perm())
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, len(mask))
	if n, err := f.ReadAt(b, off); n != len(b) {
		t.Fatalf("read %d bytes at %d of %s: %d, %v", len(b), off, path, n, err)
	}
	for i := range b {
		b[i] ^= mask[i]
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
