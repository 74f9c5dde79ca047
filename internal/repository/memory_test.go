package repository

import (
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/memdev"
)

type remoteMemory struct{}

func (remoteMemory) Ref() string                 { return "remote:1" }
func (remoteMemory) Size() int64                 { return 4096 }
func (remoteMemory) Open() (memdev.Lower, error) { return nil, os.ErrInvalid }

// TestResolvedMemorySourceIsTheBackendsOrTheFile: a device serves the
// backend's remote source when there is one, else the local memory file,
// named by its absolute path.
func TestResolvedMemorySourceIsTheBackendsOrTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), MemoryFileName)
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	local := Resolved{MemoryPath: path}.MemorySource()
	if local.Ref() != path {
		t.Fatalf("local source %q, want the file %q", local.Ref(), path)
	}
	l, err := local.Open()
	if err != nil || l.Size() != 4096 {
		t.Fatalf("open the local file: %v", err)
	}
	l.Close()
	if got := (Resolved{Memory: remoteMemory{}}).MemorySource(); got.Ref() != "remote:1" {
		t.Fatalf("remote source %q, want the backend's", got.Ref())
	}
}
