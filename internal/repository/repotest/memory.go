package repotest

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"testing"

	"warmstart/internal/repository"
)

// ResolvedMemorySHA256 is the lowercase hex SHA-256 of a resolved
// snapshot's memory, read from the local file or, for backends that serve
// it remotely, through Resolved.Memory.
func ResolvedMemorySHA256(t testing.TB, res repository.Resolved) string {
	t.Helper()
	if res.Memory == nil {
		return FileSHA256(t, res.MemoryPath)
	}
	if res.MemoryPath != "" {
		t.Errorf("resolved memory has both a path (%s) and a source", res.MemoryPath)
	}
	rd, err := res.Memory.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if rd.Size() != res.Record.MemorySize || res.Memory.Size() != res.Record.MemorySize {
		t.Fatalf("memory source size %d, reader size %d, record says %d", res.Memory.Size(), rd.Size(), res.Record.MemorySize)
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(rd, 0, rd.Size())); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
