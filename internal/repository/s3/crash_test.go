package s3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// Environment of the publish-stall child.
const (
	stallVMEnv  = "WARMSTART_TEST_STALL_VM"
	stallMemEnv = "WARMSTART_TEST_STALL_MEM"
)

// childPublishStall publishes the files the environment names and, once
// every chunk and artifact is uploaded but before the record is written,
// says "ready <id>" and stalls until it is killed.
func childPublishStall(ctx context.Context, repo repository.Repository) int {
	r, ok := repo.(*Repo)
	if !ok {
		return repotest.Report(errors.New("not an s3 repository"))
	}
	lease, err := r.BeginCapture(ctx)
	if err != nil {
		return repotest.Report(err)
	}
	mem, err := os.Stat(os.Getenv(stallMemEnv))
	if err != nil {
		return repotest.Report(err)
	}
	r.beforeRecord = func() {
		fmt.Printf("ready %s\n", lease.SnapshotID())
		<-ctx.Done()
	}
	_, err = r.Publish(ctx, lease, repository.PublishRequest{
		VMStatePath: os.Getenv(stallVMEnv), MemoryPath: os.Getenv(stallMemEnv), Layout: layout.Single(mem.Size()),
	})
	return repotest.Report(err)
}

// TestPublishKilledBeforeRecordIsResumed kills a publishing process after
// its uploads, before its record: nothing of it is visible, and the next
// publish of the same memory uploads none of the chunks again.
func TestPublishKilledBeforeRecordIsResumed(t *testing.T) {
	r := chunkyRepo(t, "")
	in := chunkyInputs(t, 31)
	o := chunkyOptions(t, server.Endpoint, r.keys.prefix)
	desc, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	// The child's own temporary directory, to see that a killed child
	// leaves nothing there: what it makes lies under the parent's CacheDir.
	childTmp := t.TempDir()
	child := repotest.StartChild(t, "publish-stall", string(desc),
		map[string]string{stallVMEnv: in.VMStatePath, stallMemEnv: in.MemoryPath, "TMPDIR": childTmp}, nil)
	id := child.Ready(t)
	if err := child.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, sig := child.Wait(t); sig != syscall.SIGKILL {
		t.Fatalf("child ended by %v, not SIGKILL; stderr: %s", sig, child.Stderr())
	}
	if left, err := os.ReadDir(childTmp); err != nil || len(left) != 0 {
		t.Fatalf("the killed child left %v in its TMPDIR (%v); its files must lie under the parent's directory", left, err)
	}
	if _, err := r.Get(bg(), id); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("Get of the killed publish: %v, want ErrNotFound", err)
	}
	if recs, err := r.List(bg(), repository.Filter{}); err != nil || len(recs) != 0 {
		t.Fatalf("List after the killed publish: %v, %v", recs, err)
	}
	if got := len(chunkKeys(t, r)); got != 6 {
		t.Fatalf("the killed publish left %d chunks, want its 6", got)
	}
	before := r.ChunksSkipped()
	rec, _ := repotest.PublishInputs(t, r, in, "")
	if skipped := r.ChunksSkipped() - before; skipped != 7 {
		t.Fatalf("the publish after the crash uploaded %d of 7 chunks again", 7-skipped)
	}
	readsBack(t, r.keys.prefix, rec.ID, in.MemorySHA256)
}

// TestStoreStoppedMidPublish stops MinIO while a publish uploads its
// chunks (issue 27, failure 6: the objects a publish wrote stayed, and
// their chunk map kept their chunks from collection): the publish fails
// with an error and goes on trying to remove what it wrote; MinIO comes
// back while it tries, and once Publish has returned nothing of the
// snapshot is left, no record (and so no snapshot) is visible, and the
// publish of the same memory succeeds, reusing the chunks that made it
// before the stop.
func TestStoreStoppedMidPublish(t *testing.T) {
	own, r := ownChunkyRepo(t)
	in := chunkyInputs(t, 41)
	lease := beginCapture(t, r)
	req := in.Request("")
	var stopOnce, restartOnce sync.Once
	req.Progress = func(p repository.ImportProgress) {
		if p.Artifact == repository.MemoryFileName && p.DoneBytes >= 3*testChunkBytes {
			stopOnce.Do(func() { own.Stop() })
		}
	}
	var failedCleanups int
	r.cleanupRetry = func(err error) {
		failedCleanups++
		restartOnce.Do(func() {
			t.Logf("cleanup with the store stopped: %v", err)
			if err := own.Start(); err != nil {
				t.Error(err)
			}
		})
	}
	ctx, cancel := context.WithTimeout(bg(), 2*time.Minute)
	defer cancel()
	if _, err := r.Publish(ctx, lease, req); err == nil {
		t.Fatal("publish succeeded with the store stopped")
	} else {
		t.Logf("publish with the store stopped: %v", err)
	}
	if failedCleanups == 0 {
		t.Fatal("the cleanup never found the store stopped: the test stopped it too late")
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	if left := snapshotKeys(t, r); len(left) != 0 {
		t.Fatalf("the failed publish left %v", left)
	}
	if recs, err := r.List(bg(), repository.Filter{}); err != nil || len(recs) != 0 {
		t.Fatalf("after the failed publish: List = %v, %v", recs, err)
	}
	if _, err := r.Get(bg(), lease.SnapshotID()); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("Get of the failed publish: %v", err)
	}
	before := r.ChunksSkipped()
	rec, _ := repotest.PublishInputs(t, r, in, "")
	if r.ChunksSkipped()-before == 0 {
		t.Fatal("the publish after the store came back reused no chunk")
	}
	res, err := r.Resolve(bg(), rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := repotest.ResolvedMemorySHA256(t, res); got != in.MemorySHA256 {
		t.Fatalf("memory reads back as %s, want %s", got, in.MemorySHA256)
	}
}
