package s3

import (
	"os"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore/restoretest"
	"warmstart/internal/vmm"
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
	rec, lease := publishReplayable(t, repo)
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

// publishReplayable is publishWithDigests of inputs whose VM state is the
// replay VMM's (the synthetic state header): the replay VMM refuses any
// other before the restore reaches memory, as a real VMM refuses a state
// file it did not write.
func publishReplayable(t *testing.T, repo *Repo) (repository.Record, repository.Lease) {
	t.Helper()
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	if err := os.WriteFile(in.VMStatePath, []byte(vmm.ReplayStateMagic+"\nseed 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec, lease := repotest.PublishInputs(t, repo, in, "")
	if rec.MemoryDigests == nil {
		t.Fatal("published without a digest table; the test needs one")
	}
	return rec, lease
}
