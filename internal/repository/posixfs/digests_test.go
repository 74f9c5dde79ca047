package posixfs

import (
	"errors"
	"os"
	"strings"
	"testing"

	"warmstart/internal/integrity"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs/posixfstest"
	"warmstart/internal/repository/repotest"
)

// TestAttachDigestsToLegacySnapshot gives a snapshot published before
// digest tables existed (its record has no memory_digests, its directory no
// memory.digests) a table: the record then describes it, the file is
// read-only, and nothing temporary is left.
func TestAttachDigestsToLegacySnapshot(t *testing.T) {
	r := openTemp(t, Options{})
	in := repotest.NewInputs(t, repotest.LargeMemoryBytes)
	rec, lease := repotest.PublishInputs(t, r, in, "legacy")
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	posixfstest.StripDigests(t, r.Root(), rec.ID)
	res, err := r.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Record.MemoryDigests != nil || res.DigestsPath != "" {
		t.Fatalf("legacy snapshot resolves with digests %+v at %q", res.Record.MemoryDigests, res.DigestsPath)
	}

	lease, err = r.LeaseExisting(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	table := repotest.DigestTable(t, in.MemoryPath)
	desc, err := r.AttachDigests(bg(), lease, table)
	if err != nil {
		t.Fatal(err)
	}
	if desc != *rec.MemoryDigests {
		t.Fatalf("attached %+v, publish had computed %+v", desc, *rec.MemoryDigests)
	}
	repotest.CheckDigests(t, r, rec.ID, table)
	path := r.paths.artifactPath(rec.ID, repository.DigestsFileName)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != artifactFileMode {
		t.Errorf("%s has mode %v, want %v", path, fi.Mode().Perm(), os.FileMode(artifactFileMode))
	}
	got, err := r.Get(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec.MemoryDigests = &desc
	if got.MemorySHA256 != rec.MemorySHA256 || got.Alias != "legacy" || !got.CreatedAt.Equal(rec.CreatedAt) || !got.Layout.Equal(rec.Layout) {
		t.Fatalf("attach changed the rest of the record: %+v, was %+v", got, rec)
	}
	for _, f := range storeFiles(t, r.Root()) {
		if strings.HasSuffix(f, tempSuffix) {
			t.Errorf("temporary file left: %s", f)
		}
	}
}

// TestAttachDigestsRefusesATableOfAnotherSize checks the refusal leaves a
// legacy snapshot as it was: no descriptor, no file.
func TestAttachDigestsRefusesATableOfAnotherSize(t *testing.T) {
	r := openTemp(t, Options{})
	rec, lease := repotest.Publish(t, r, "")
	posixfstest.StripDigests(t, r.Root(), rec.ID)
	b := integrity.NewBuilder(integrity.CRC32C, 0)
	b.Write(make([]byte, rec.MemorySize+1))
	_, err := r.AttachDigests(bg(), lease, b.Table().Encode())
	if !errors.Is(err, repository.ErrInvalidRequest) {
		t.Fatalf("AttachDigests of a table of %d bytes to a %d-byte memory file: %v", rec.MemorySize+1, rec.MemorySize, err)
	}
	got, err := r.Get(bg(), rec.ID)
	if err != nil || got.MemoryDigests != nil {
		t.Fatalf("refused attach left %+v, %v", got.MemoryDigests, err)
	}
	if _, err := os.Lstat(r.paths.artifactPath(rec.ID, repository.DigestsFileName)); !os.IsNotExist(err) {
		t.Fatalf("refused attach wrote %s: %v", repository.DigestsFileName, err)
	}
}
