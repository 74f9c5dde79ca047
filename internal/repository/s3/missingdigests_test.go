package s3

import (
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore/restoretest"
)

// TestMissingDigestTableOfALiveSnapshotIsAnIntegrityFailure removes only
// the digest table object of a snapshot that stays published: that is
// damage, not a delete racing the restore, so the restore counts it.
//
// It fails today: fetchForCheck hands the restore a path that does not
// exist for a missing object, and the restore's integrityFailedUnlessGone
// (internal/restore/verify.go) no longer counts a missing file, so this
// damage is neither counted nor logged as an integrity failure (it was
// before 517c7e5). Skipped until the fix decides where the missing object
// of a live snapshot is told apart from a deleted one.
func TestMissingDigestTableOfALiveSnapshotIsAnIntegrityFailure(t *testing.T) {
	t.Skip("known defect: a live S3 snapshot's missing digest table is not counted as an integrity failure (see comment)")
	w := newWorld(t, server.Endpoint)
	repo := w.repo(t, 0)
	rec, lease := repotest.Publish(t, repo, "")
	if rec.MemoryDigests == nil {
		t.Fatal("published without a digest table; the test needs one")
	}
	if err := repo.remove(bg(), repo.keys.artifact(rec.ID, repository.DigestsFileName)); err != nil {
		t.Fatal(err)
	}
	counter := &restoretest.IntegrityCounter{}
	w.tracing.Observe = counter
	rc := &recorder.Recorder{Repo: repo, Restorer: w.tracing, Device: config.DeviceFile}
	job := rc.Start(bg(), lease)
	<-job.Done()
	_, err := job.Result()
	if err == nil {
		t.Fatal("recording of a snapshot without its digest table succeeded")
	}
	t.Logf("error: %v", err)
	if got := counter.Failures(); len(got) != 1 || got[0] != "digests" {
		t.Errorf("integrity failures counted: %v; want [digests]", got)
	}
}
