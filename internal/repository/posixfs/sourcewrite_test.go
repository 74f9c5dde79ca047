package posixfs

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestSourceWrittenDuringPublish: a VMM (or anything) that writes the
// memory file while it is being copied leaves the copy a mix of bytes from
// before and after, which no moment of the guest ever held, yet is
// consistent with the digests computed from what was read. The publish
// must refuse it, naming the file, and publish nothing; imported again once
// nothing writes the file, it succeeds.
func TestSourceWrittenDuringPublish(t *testing.T) {
	r := openTemp(t, Options{ForceCopy: true})
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	r.afterCopy = func(path string) {
		if !strings.Contains(path, repository.MemoryFileName) {
			return
		}
		// The same size, other bytes, a later modification time.
		f, err := os.OpenFile(in.MemoryPath, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteAt([]byte{1, 2, 3}, 0)
			err = errors.Join(err, f.Close())
		}
		if err == nil {
			later := time.Now().Add(time.Second)
			err = os.Chtimes(in.MemoryPath, later, later)
		}
		if err != nil {
			t.Errorf("write %s: %v", in.MemoryPath, err)
		}
	}
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	_, err = r.Publish(bg(), lease, in.Request("torn"))
	if err == nil || !strings.Contains(err.Error(), "changed while") || !strings.Contains(err.Error(), in.MemoryPath) {
		t.Fatalf("Publish of a memory file written during its copy = %v, want an error naming it as changed", err)
	}
	// The caller's mistake (something still writes the file it sent), so
	// an importer answers it as one: on the field the file came in.
	if fe := (*repository.FieldError)(nil); !errors.As(err, &fe) || fe.Field != repository.FieldMemory ||
		!errors.Is(err, repository.ErrInvalidRequest) {
		t.Fatalf("Publish of a memory file written during its copy = %v (%#v), want an invalid request on field %q",
			err, fe, repository.FieldMemory)
	}
	if _, err := os.Stat(r.paths.snapshotDir(lease.SnapshotID())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused publish left its directory: %v", err)
	}
	r.afterCopy = nil
	if _, err := r.Publish(bg(), lease, in.Request("torn")); err != nil {
		t.Fatalf("publish once nothing writes the file: %v", err)
	}
}
