package s3

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/logtest"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore/restoretest"
)

// TestRecordingOfASnapshotDeletedDuringResolveIsDiscarded deletes the
// snapshot inside the recording's Resolve, after its record and VM state
// were read and before its digest table is fetched: the table object is
// gone, so the restore finds no table file. That is the deletion racing
// the recording: it ends as discarded, and neither its error, the
// integrity counter nor the log speaks of an integrity failure.
func TestRecordingOfASnapshotDeletedDuringResolveIsDiscarded(t *testing.T) {
	w := newWorld(t, server.Endpoint)
	repo := w.repo(t, 0)
	_, lease := publishWithDigests(t, repo)
	repo.beforeResolveDigests = func(id string) {
		if err := repo.Delete(bg(), id); err != nil {
			t.Error(err)
		}
	}
	counter, logs := &restoretest.IntegrityCounter{}, &logtest.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	w.tracing.Observe, w.tracing.Log = counter, log
	rc := &recorder.Recorder{Repo: repo, Restorer: w.tracing, Device: config.DeviceFile, Log: log}
	job := rc.Start(bg(), lease)
	<-job.Done()
	_, err := job.Result()
	if !errors.Is(err, recorder.ErrDiscarded) {
		t.Fatalf("recording of a snapshot deleted during resolve: %v, want ErrDiscarded", err)
	}
	if errors.Is(err, repository.ErrIntegrity) {
		t.Errorf("a discarded recording's error matches ErrIntegrity: %v", err)
	}
	if got := counter.Failures(); len(got) != 0 {
		t.Errorf("integrity failures counted: %v; want none", got)
	}
	if out := logs.String(); strings.Contains(out, "integrity") || !strings.Contains(out, "startup manifest recording discarded") {
		t.Errorf("log speaks of integrity or not of a discarded recording:\n%s", out)
	}
}

// publishWithDigests publishes a snapshot that has a digest table, which
// the tests of a missing table need.
func publishWithDigests(t *testing.T, repo *Repo) (repository.Record, repository.Lease) {
	t.Helper()
	rec, lease := repotest.Publish(t, repo, "")
	if rec.MemoryDigests == nil {
		t.Fatal("published without a digest table; the test needs one")
	}
	return rec, lease
}
