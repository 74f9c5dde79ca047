package s3

import (
	"testing"

	"github.com/minio/minio-go/v7"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestAttachDigestsToLegacySnapshot gives a snapshot published before
// digest tables existed (no descriptor in its record, no memory.digests
// object) a table, and Resolve then hands it out.
func TestAttachDigestsToLegacySnapshot(t *testing.T) {
	r := openRepo(t)
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	rec, lease := repotest.PublishInputs(t, r, in, "legacy")
	legacy := rec
	legacy.MemoryDigests = nil
	if _, err := r.putRecord(bg(), legacy, putCondition{}); err != nil {
		t.Fatal(err)
	}
	if err := r.core.RemoveObject(bg(), r.bucket, r.keys.artifact(rec.ID, repository.DigestsFileName), minio.RemoveObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if res, err := r.Resolve(bg(), rec.ID); err != nil || res.DigestsPath != "" {
		t.Fatalf("legacy snapshot resolves with digest table %q, %v", res.DigestsPath, err)
	}
	table := repotest.DigestTable(t, in.MemoryPath)
	desc, err := r.AttachDigests(bg(), lease, table)
	if err != nil {
		t.Fatal(err)
	}
	if desc != *rec.MemoryDigests {
		t.Fatalf("attached %+v, publish had computed %+v", desc, *rec.MemoryDigests)
	}
	repotest.CheckDigests(t, r, rec.ID, table)
}
