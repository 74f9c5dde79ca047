package daemon_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/repository/posixfs"
)

// A daemon killed with SIGKILL during the background recording after an
// import leaves the snapshot without a manifest; the next daemon resumes
// that recording at start, says so, and the manifest is attached.
func TestRecordingResumedAfterKill(t *testing.T) {
	f := newFixture(t, fixtureOptions{recordOnPublish: true})
	c := startChild(t, f.cfgPath, childStallRecordingEnv+"=1")
	ctx := context.Background()
	client := api.NewClient(f.cfg.Daemon.Socket)
	imp, err := client.Import(ctx, f.importRequest("ref"))
	client.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !imp.Recording {
		t.Fatalf("import = %+v; want a background recording", imp)
	}
	c.wait(t, msgRecordingStarted)
	if err := syscall.Kill(c.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.exited

	store, err := posixfs.Open(f.cfg.Backend.PosixFS.SnapshotStore, posixfs.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Get(ctx, imp.ID)
	if err != nil || rec.Manifest != nil || !rec.ManifestRequested {
		t.Fatalf("after the kill: %+v, %v; want a record asking for a manifest and without one", rec, err)
	}

	again := startChild(t, f.cfgPath)
	// A daemon that never resumes would never log it: kill it after a
	// bound so the wait below fails instead of hanging.
	bound := time.AfterFunc(2*time.Minute, func() { syscall.Kill(again.pid, syscall.SIGKILL) })
	defer bound.Stop()
	again.wait(t, "resuming interrupted manifest recording")
	again.wait(t, "startup manifest attached")
	if rec, err = store.Get(ctx, imp.ID); err != nil || rec.Manifest == nil {
		t.Fatalf("after the restart: %+v, %v; want the manifest attached", rec, err)
	}
	if err := syscall.Kill(again.pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-again.exited
}
