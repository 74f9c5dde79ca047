package s3

import (
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// TestRefinementSwitchesInOneRecordWrite: while a new refinement's object
// is uploaded and its record not yet written (where a crash would stop
// it), readers get the old refinement whole; once the record is written
// they get the new one, and the old object is gone.
func TestRefinementSwitchesInOneRecordWrite(t *testing.T) {
	r := openRepo(t)
	rec, lease := repotest.Publish(t, r, "")
	defer lease.End()
	base := repotest.ManifestBytes(t, 64)
	if _, err := r.AttachManifest(bg(), lease, base, nil); err != nil {
		t.Fatal(err)
	}
	first := repotest.RefinementOf(t, base, 1)
	d1, err := r.AttachRefinement(bg(), lease, first)
	if err != nil {
		t.Fatal(err)
	}
	o := r.opts
	o.CacheDir = t.TempDir() // a second node reading the same bucket
	reader := openWith(t, o)
	second := repotest.RefinementOf(t, base, 2)
	second.PreviousSHA256 = d1.SHA256
	midway := false
	r.beforeAttachRecord = func() {
		midway = true
		repotest.CheckRefinement(t, reader, rec.ID, first)
	}
	if _, err := r.AttachRefinement(bg(), lease, second); err != nil {
		t.Fatal(err)
	}
	if !midway {
		t.Fatal("the attach never reached its record write")
	}
	repotest.CheckRefinement(t, reader, rec.ID, second)
	old := r.keys.artifact(rec.ID, repository.RefinementFileName(d1.SHA256))
	if ok, err := r.exists(bg(), old); err != nil || ok {
		t.Fatalf("the replaced refinement's object %s is still there (%v)", old, err)
	}
}
