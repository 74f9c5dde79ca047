package s3

import (
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/restore/restoretest"
)

// TestMissingDigestTableOfALiveSnapshotIsAnIntegrityFailure removes only
// the digest table object a restore of remote memory reads (the one of
// SHA-256 digests) of a snapshot that stays published: that is damage,
// not a delete racing the restore, so the restore counts it. (The s3
// backend hands the restore a missing file for a missing object; the
// restore must not take that for a delete racing it.)
func TestMissingDigestTableOfALiveSnapshotIsAnIntegrityFailure(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	repo := w.repo(t, 0)
	rec, lease := publishWithDigests(t, repo)
	if err := repo.remove(bg(), repo.keys.artifact(rec.ID, repository.SHA256DigestsFileName)); err != nil {
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
