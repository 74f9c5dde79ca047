package repotest

import (
	"bytes"
	"os"
	"testing"

	"warmstart/internal/integrity"
	"warmstart/internal/repository"
)

// DigestTable is the encoded table of CRC-32C digests of the file at
// path (Record.MemoryDigests).
func DigestTable(t testing.TB, path string) []byte {
	t.Helper()
	return tableOf(t, integrity.CRC32C, path)
}

// SHA256DigestTable is the encoded table of SHA-256 digests of the file
// at path (Record.MemorySHA256Digests).
func SHA256DigestTable(t testing.TB, path string) []byte {
	t.Helper()
	return tableOf(t, integrity.SHA256, path)
}

func tableOf(t testing.TB, alg integrity.Algorithm, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := integrity.NewBuilder(alg, int64(len(data)))
	b.Write(data)
	return b.Table().Encode()
}

// CheckDigests asserts that id's record carries the descriptor of the
// encoded table and that the table Resolve points at holds it.
func CheckDigests(t testing.TB, repo repository.Repository, id string, table []byte) {
	t.Helper()
	res, err := repo.Resolve(bg(), id)
	if err != nil {
		t.Fatal(err)
	}
	want := repository.DescribeDigests(table)
	if d := res.Record.MemoryDigests; d == nil || *d != want {
		t.Fatalf("record digest table %+v, want %+v", d, want)
	}
	got, err := os.ReadFile(res.DigestsPath)
	if err != nil {
		t.Fatalf("resolved digest table: %v", err)
	}
	if !bytes.Equal(got, table) {
		t.Fatal("resolved digest table does not hold the attached bytes")
	}
}

// testAttachDigests attaches the table of the memory again (a no-op in
// effect), then another valid table, which replaces it.
func testAttachDigests(t *testing.T, repo repository.Repository) {
	in := NewInputs(t, SmallMemoryBytes)
	rec, lease := PublishInputs(t, repo, in, "digests")
	manifest := ManifestBytes(t, 64)
	if _, err := repo.AttachManifest(bg(), lease, manifest, nil); err != nil {
		t.Fatal(err)
	}
	table := DigestTable(t, in.MemoryPath)
	desc, err := repo.AttachDigests(bg(), lease, table)
	if err != nil {
		t.Fatal(err)
	}
	if desc != *rec.MemoryDigests {
		t.Fatalf("attaching the published table again gave %+v, publish gave %+v", desc, *rec.MemoryDigests)
	}
	CheckDigests(t, repo, rec.ID, table)

	other := DigestTable(t, NewInputs(t, SmallMemoryBytes).MemoryPath)
	desc, err = repo.AttachDigests(bg(), lease, other)
	if err != nil {
		t.Fatal(err)
	}
	if desc != repository.DescribeDigests(other) {
		t.Fatalf("descriptor %+v does not describe the attached table", desc)
	}
	CheckDigests(t, repo, rec.ID, other)
	// The rest of the record, the manifest included, is untouched.
	checkAttached(t, repo, rec.ID, manifest)
	got, err := repo.Get(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.MemorySHA256 != rec.MemorySHA256 || got.Alias != rec.Alias || !got.CreatedAt.Equal(rec.CreatedAt) || !got.Layout.Equal(rec.Layout) {
		t.Fatalf("attach changed the record: %+v, was %+v", got, rec)
	}
}

func testAttachDigestsRefused(t *testing.T, repo repository.Repository) {
	t.Run("not a table of the memory file", func(t *testing.T) {
		in := NewInputs(t, SmallMemoryBytes)
		rec, lease := PublishInputs(t, repo, in, "")
		table := DigestTable(t, in.MemoryPath)
		longer := DigestTable(t, NewInputs(t, 2*SmallMemoryBytes).MemoryPath)
		for name, data := range map[string][]byte{
			"empty":          nil,
			"garbage":        bytes.Repeat([]byte{0xA5}, len(table)),
			"truncated":      table[:len(table)-4],
			"another's size": longer,
		} {
			_, err := repo.AttachDigests(bg(), lease, data)
			wantErr(t, "AttachDigests of a table that is "+name, err, repository.ErrInvalidRequest)
		}
		CheckDigests(t, repo, rec.ID, table)
	})
	t.Run("foreign lease", func(t *testing.T) {
		rec, _ := Publish(t, repo, "")
		_, err := repo.AttachDigests(bg(), strangerLease{id: rec.ID}, []byte("t"))
		wantErr(t, "AttachDigests with a foreign lease", err, repository.ErrInvalidRequest)
		_, err = repo.AttachDigests(bg(), nil, []byte("t"))
		wantErr(t, "AttachDigests with a nil lease", err, repository.ErrInvalidRequest)
	})
	t.Run("lease ended", func(t *testing.T) {
		in := NewInputs(t, SmallMemoryBytes)
		rec, lease := PublishInputs(t, repo, in, "")
		if err := lease.End(); err != nil {
			t.Fatal(err)
		}
		other := DigestTable(t, NewInputs(t, SmallMemoryBytes).MemoryPath)
		_, err := repo.AttachDigests(bg(), lease, other)
		wantErr(t, "AttachDigests after End", err, repository.ErrLeaseEnded)
		CheckDigests(t, repo, rec.ID, DigestTable(t, in.MemoryPath))
	})
	t.Run("deleted", func(t *testing.T) {
		in := NewInputs(t, SmallMemoryBytes)
		rec, lease := PublishInputs(t, repo, in, "digests-deleted")
		if err := repo.Delete(bg(), rec.ID); err != nil {
			t.Fatal(err)
		}
		_, err := repo.AttachDigests(bg(), lease, DigestTable(t, in.MemoryPath))
		wantErr(t, "AttachDigests after Delete", err, repository.ErrNotFound)
		_, err = repo.Get(bg(), rec.ID)
		wantErr(t, "Get after refused AttachDigests", err, repository.ErrNotFound)
		if recs := mustList(t, repo, repository.Filter{AliasPrefix: "digests-deleted"}); len(recs) != 0 {
			t.Fatalf("refused AttachDigests resurrected %v", ids(recs))
		}
	})
	t.Run("not yet published", func(t *testing.T) {
		lease, err := repo.BeginCapture(bg())
		if err != nil {
			t.Fatal(err)
		}
		defer lease.End()
		_, err = repo.AttachDigests(bg(), lease, DigestTable(t, NewInputs(t, SmallMemoryBytes).MemoryPath))
		wantErr(t, "AttachDigests before Publish", err, repository.ErrNotFound)
		_, err = repo.Get(bg(), lease.SnapshotID())
		wantErr(t, "Get after AttachDigests before Publish", err, repository.ErrNotFound)
	})
}
