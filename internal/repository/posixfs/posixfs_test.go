package posixfs

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"

	"warmstart/internal/reexec"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

func TestMain(m *testing.M) {
	reexec.Roles{repotest.ChildExecRole: func() int { return childMain(repotest.ChildRole()) }}.Dispatch()
	os.Exit(m.Run())
}

func openTemp(t *testing.T, opts Options) *Repo {
	t.Helper()
	r, err := Open(filepath.Join(t.TempDir(), "store"), opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestBehaviourHardLink(t *testing.T) {
	t.Parallel()
	repotest.Run(t, func(t *testing.T) repository.Repository { return openTemp(t, Options{}) })
}

func TestBehaviourCopy(t *testing.T) {
	t.Parallel()
	repotest.Run(t, func(t *testing.T) repository.Repository { return openTemp(t, Options{ForceCopy: true}) })
}

func TestSigning(t *testing.T) {
	t.Parallel()
	repotest.RunSigning(t, func(t *testing.T, key ed25519.PrivateKey) repository.Repository {
		return openTemp(t, Options{SigningKey: key})
	})
}

func bg() context.Context { return context.Background() }

// storeFiles lists every file and directory under root, relative to it.
func storeFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel != "." {
			if d.IsDir() {
				rel += "/"
			}
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func TestOnDiskLayout(t *testing.T) {
	r := openTemp(t, Options{})
	rec, lease := repotest.Publish(t, r, "web")
	if _, err := r.AttachManifest(bg(), lease, []byte("manifest"), nil); err != nil {
		t.Fatal(err)
	}
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"catalog/", "catalog/aliases/", "catalog/aliases/web", "catalog/leases/", "catalog/locks/",
		"catalog/records/", "catalog/records/" + rec.ID + ".json",
		"snapshots/", "snapshots/" + rec.ID + "/",
		"snapshots/" + rec.ID + "/memory.bin", "snapshots/" + rec.ID + "/memory.digests",
		"snapshots/" + rec.ID + "/memory.sha256-digests",
		"snapshots/" + rec.ID + "/startup-manifest.bin", "snapshots/" + rec.ID + "/vm_state.bin",
	}
	if got := storeFiles(t, r.Root()); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("store holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	alias, err := os.ReadFile(filepath.Join(r.Root(), "catalog/aliases/web"))
	if err != nil || string(alias) != rec.ID+"\n" {
		t.Fatalf("alias file holds %q, %v", alias, err)
	}
}

// publishWith publishes in under a new lease with req adjusted by adjust.
func publishWith(t *testing.T, r *Repo, in repotest.Inputs, adjust func(*repository.PublishRequest)) repository.Record {
	t.Helper()
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	req := in.Request("")
	if adjust != nil {
		adjust(&req)
	}
	rec, err := r.Publish(bg(), lease, req)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// A publish copies its inputs unless asked to link; a link shares the
// source's inode and takes its write bits away, and only those.
func TestCopyByDefaultLinkOnlyOnRequest(t *testing.T) {
	for _, link := range []bool{false, true} {
		t.Run(fmt.Sprintf("Link=%v", link), func(t *testing.T) {
			r := openTemp(t, Options{})
			in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
			// Readable by its group only: a link must not open it to others.
			if err := os.Chmod(in.MemoryPath, 0o640); err != nil {
				t.Fatal(err)
			}
			rec := publishWith(t, r, in, func(req *repository.PublishRequest) { req.Link = link })
			src, err := os.Stat(in.MemoryPath)
			if err != nil {
				t.Fatal(err)
			}
			stored, err := os.Stat(r.paths.artifactPath(rec.ID, repository.MemoryFileName))
			if err != nil {
				t.Fatal(err)
			}
			if linked := os.SameFile(src, stored); linked != link {
				t.Fatalf("Link=%v but stored memory shares the source inode: %v", link, linked)
			}
			if link && src.Mode().Perm() != 0o440 {
				t.Fatalf("linked source inode (was 0640) has mode %v, want 0440: write bits off, nobody new may read", src.Mode().Perm())
			}
			if rec.MemorySHA256 != in.MemorySHA256 {
				t.Fatalf("memory sha %s, want %s", rec.MemorySHA256, in.MemorySHA256)
			}
		})
	}
}

// An in-place write to an import source, as `dd conv=notrunc` does, must
// not reach the published snapshot.
func TestWriteToSourceAfterImportLeavesSnapshotUnchanged(t *testing.T) {
	r := openTemp(t, Options{})
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	rec := publishWith(t, r, in, nil)
	f, err := os.OpenFile(in.MemoryPath, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0x5a}, 8192), 4096); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := hashFile(bg(), r.paths.artifactPath(rec.ID, repository.MemoryFileName), false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.sha256 != rec.MemorySHA256 {
		t.Fatalf("published memory changed with its source: sha %s, record says %s", got.sha256, rec.MemorySHA256)
	}
}

func TestArtifactsReadOnlyAndStorePrivate(t *testing.T) {
	r := openTemp(t, Options{})
	rec, lease := repotest.Publish(t, r, "")
	if _, err := r.AttachManifest(bg(), lease, []byte("manifest"), nil); err != nil {
		t.Fatal(err)
	}
	lease.End()
	for _, name := range []string{repository.VMStateFileName, repository.MemoryFileName, repository.DigestsFileName, repository.ManifestFileName} {
		fi, err := os.Stat(r.paths.artifactPath(rec.ID, name))
		if err != nil || fi.Mode().Perm() != 0o444 {
			t.Errorf("%s: mode %v (%v), want 0444", name, fi.Mode().Perm(), err)
		}
	}
	for _, dir := range append(r.paths.dirs(), r.paths.root, r.paths.snapshotDir(rec.ID)) {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: mode %v (%v), want no access for group or others", dir, fi.Mode().Perm(), err)
		}
	}
}

func TestSymlinkedInputsAreStoredAsFiles(t *testing.T) {
	for _, force := range []bool{false, true} {
		r := openTemp(t, Options{ForceCopy: force})
		in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
		link := filepath.Join(t.TempDir(), "memory-link")
		if err := os.Symlink(in.MemoryPath, link); err != nil {
			t.Fatal(err)
		}
		lease, err := r.BeginCapture(bg())
		if err != nil {
			t.Fatal(err)
		}
		req := in.Request("")
		req.MemoryPath = link
		rec, err := r.Publish(bg(), lease, req)
		_ = lease.End()
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(r.paths.artifactPath(rec.ID, repository.MemoryFileName))
		if err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("ForceCopy=%v: stored memory is %v (%v), want a regular file", force, fi.Mode(), err)
		}
		if rec.MemorySHA256 != in.MemorySHA256 {
			t.Fatal("stored memory differs")
		}
	}
}

func TestCopyIntegrityMismatch(t *testing.T) {
	r := openTemp(t, Options{ForceCopy: true})
	r.afterCopy = func(path string) {
		if !strings.Contains(path, repository.MemoryFileName) {
			return
		}
		// Stand in for a device that lost a write: change one stored byte.
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteAt([]byte{0xff, 0x00, 0xff}, 4096)
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			t.Errorf("corrupt %s: %v", path, err)
		}
	}
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	_, err = r.Publish(bg(), lease, in.Request("bad"))
	var ie *repository.IntegrityError
	if !errors.Is(err, repository.ErrIntegrity) || !errors.As(err, &ie) || ie.Artifact != repository.MemoryFileName || ie.Want != in.MemorySHA256 {
		t.Fatalf("Publish = %v, want an integrity error on %s wanting %s", err, repository.MemoryFileName, in.MemorySHA256)
	}
	if _, err := os.Stat(r.paths.snapshotDir(lease.SnapshotID())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed publish left its directory: %v", err)
	}
	if _, err := r.ResolveAlias(bg(), "bad"); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("failed publish left its alias: %v", err)
	}
	r.afterCopy = nil
	if _, err := r.Publish(bg(), lease, in.Request("bad")); err != nil {
		t.Fatalf("publish once the store behaves: %v", err)
	}
}

func TestSourceChangedSizeDuringPublish(t *testing.T) {
	r := openTemp(t, Options{ForceCopy: true})
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	req := in.Request("")
	req.Progress = func(p repository.ImportProgress) {
		// Once the vm state is in, grow the memory file behind Publish's back.
		if p.Artifact == repository.VMStateFileName && p.Step == repository.StepVerify && p.DoneBytes == p.TotalBytes {
			f, err := os.OpenFile(in.MemoryPath, os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				_, err = f.Write(make([]byte, 4096))
				err = errors.Join(err, f.Close())
			}
			if err != nil {
				t.Error(err)
			}
		}
	}
	_, err = r.Publish(bg(), lease, req)
	if !errors.Is(err, repository.ErrIntegrity) {
		t.Fatalf("Publish of a file that grew = %v, want ErrIntegrity", err)
	}
	if recs, _ := r.List(bg(), repository.Filter{}); len(recs) != 0 {
		t.Fatalf("listed %d records", len(recs))
	}
}

// TestLeftoversIgnoredThenSwept plants what crashed writers leave behind
// and checks that readers ignore it and Open removes it, but not what a
// live lease protects.
func TestLeftoversIgnoredThenSwept(t *testing.T) {
	r := openTemp(t, Options{})
	rec, lease := repotest.Publish(t, r, "kept")
	if err := lease.End(); err != nil {
		t.Fatal(err)
	}
	p := r.paths
	orphan, _ := repository.NewID()
	staleAliasID, _ := repository.NewID()
	plant := map[string]string{
		filepath.Join(p.recordsDir(), tempName(recordFileName(orphan))):             "{half",
		filepath.Join(p.recordsDir(), tempName(recordFileName(rec.ID))):             "{half",
		filepath.Join(p.aliasesDir(), tempName("kept")):                             "x",
		filepath.Join(p.aliasesDir(), "stale"):                                      staleAliasID + "\n",
		filepath.Join(p.snapshotDir(rec.ID), tempName(repository.ManifestFileName)): "partial",
		filepath.Join(p.snapshotDir(orphan), repository.MemoryFileName):             "orphan",
		filepath.Join(p.snapshotDir(orphan), tempName(repository.VMStateFileName)):  "orphan",
		p.recordLockPath(orphan):                                                    "",
		p.aliasLockPath("stale"):                                                    "",
		p.leasePath(orphan):                                                         "",
	}
	for path, content := range plant {
		if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A capture in progress: its directory has no record yet, but its
	// lease is live, so nothing may touch it.
	live, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	liveFile := filepath.Join(p.snapshotDir(live.SnapshotID()), tempName(repository.MemoryFileName))
	if err := os.MkdirAll(filepath.Dir(liveFile), dirMode); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(liveFile, []byte("in progress"), 0o644); err != nil {
		t.Fatal(err)
	}

	recs, err := r.List(bg(), repository.Filter{})
	if err != nil || len(recs) != 1 || recs[0].ID != rec.ID {
		t.Fatalf("List with leftovers = %v, %v", recs, err)
	}
	if _, err := r.Get(bg(), orphan); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("Get(orphan) = %v", err)
	}
	if _, err := r.ResolveAlias(bg(), "stale"); !errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("ResolveAlias(stale) = %v", err)
	}

	if _, err := Open(r.Root(), Options{}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"catalog/", "catalog/aliases/", "catalog/aliases/kept", "catalog/leases/",
		"catalog/leases/" + live.SnapshotID() + ".lock", "catalog/locks/",
		"catalog/records/", "catalog/records/" + rec.ID + ".json",
		"snapshots/", "snapshots/" + live.SnapshotID() + "/", "snapshots/" + live.SnapshotID() + "/" + filepath.Base(liveFile),
		"snapshots/" + rec.ID + "/", "snapshots/" + rec.ID + "/memory.bin", "snapshots/" + rec.ID + "/memory.digests",
		"snapshots/" + rec.ID + "/memory.sha256-digests", "snapshots/" + rec.ID + "/vm_state.bin",
	}
	sort.Strings(want)
	if got := storeFiles(t, r.Root()); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("after the sweep the store holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Once the capture ends without publishing, its directory goes too.
	if err := live.End(); err != nil {
		t.Fatal(err)
	}
	if err := r.Sweep(bg()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.snapshotDir(live.SnapshotID())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("abandoned capture directory survived the sweep: %v", err)
	}
}

func TestCorruptRecord(t *testing.T) {
	r := openTemp(t, Options{})
	rec, _ := repotest.Publish(t, r, "corrupt")
	good, _ := repotest.Publish(t, r, "good")
	if err := os.WriteFile(r.paths.recordPath(rec.ID), []byte(`{"format":1,"id":"`+rec.ID+`"`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get(bg(), rec.ID); !errors.Is(err, repository.ErrIntegrity) {
		t.Fatalf("Get(corrupt) = %v, want ErrIntegrity", err)
	}
	recs, err := r.List(bg(), repository.Filter{})
	if err != nil || len(recs) != 1 || recs[0].ID != good.ID {
		t.Fatalf("List = %v, %v; want only %s", recs, err, good.ID)
	}
	if err := r.Delete(bg(), rec.ID); err != nil {
		t.Fatalf("Delete(corrupt): %v", err)
	}
	if _, err := os.Stat(r.paths.snapshotDir(rec.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("artifacts of the corrupt record remain: %v", err)
	}
	// Its alias is stale now and goes to the next publisher.
	again, _ := repotest.Publish(t, r, "corrupt")
	if id, err := r.ResolveAlias(bg(), "corrupt"); err != nil || id != again.ID {
		t.Fatalf("ResolveAlias = %s, %v", id, err)
	}
}

func TestBadNamesNeverBecomePaths(t *testing.T) {
	parent := t.TempDir()
	r, err := Open(filepath.Join(parent, "store"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	lease, err := r.BeginCapture(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer lease.End()
	before := storeFiles(t, parent)
	for _, id := range repotest.BadIDs() {
		_, _ = r.Get(bg(), id)
		_ = r.Delete(bg(), id)
		_, _ = r.Resolve(bg(), id)
		_, _ = r.LeaseExisting(bg(), id)
		_, _ = r.Lookup(bg(), id)
	}
	for _, alias := range repotest.BadAliases() {
		if alias == "" {
			continue // no alias at all: a valid request
		}
		_, _ = r.Publish(bg(), lease, in.Request(alias))
		_, _ = r.ResolveAlias(bg(), alias)
		_, _ = r.Lookup(bg(), alias)
	}
	if after := storeFiles(t, parent); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("bad names changed the file system:\nbefore %v\nafter  %v", before, after)
	}
}

// TestAttachRacingDeleteNeverResurrects races AttachManifest and Delete in
// goroutines and checks the disk itself: after both, neither the record nor
// the snapshot directory nor any lock or lease file exists. Several streams
// of races run at once on different snapshots, which also overlaps their
// fsyncs.
func TestAttachRacingDeleteNeverResurrects(t *testing.T) {
	const streams, iterations = 4, 50
	t.Parallel()
	r := openTemp(t, Options{})
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	var mu sync.Mutex
	outcomes := map[string]int{}
	var streamsWG sync.WaitGroup
	for s := range streams {
		streamsWG.Go(func() {
			for i := range iterations {
				outcome, err := raceAttachDelete(r, in, fmt.Sprintf("race-%d", s), []byte(fmt.Sprintf("manifest %d/%d", s, i)))
				if err != nil {
					t.Errorf("stream %d iteration %d: %v", s, i, err)
					return
				}
				mu.Lock()
				outcomes[outcome]++
				mu.Unlock()
			}
		})
	}
	streamsWG.Wait()
	if got := storeFiles(t, r.Root()); len(got) != len(r.paths.dirs()) {
		t.Fatalf("store not empty after the races: %v", got)
	}
	t.Logf("outcomes over %d races: %v", streams*iterations, outcomes)
}

// raceAttachDelete publishes a snapshot, races one attach against one
// delete of it, and checks that nothing of it is left on disk.
func raceAttachDelete(r *Repo, in repotest.Inputs, alias string, data []byte) (string, error) {
	lease, err := r.BeginCapture(bg())
	if err != nil {
		return "", err
	}
	rec, err := r.Publish(bg(), lease, in.Request(alias))
	if err != nil {
		_ = lease.End()
		return "", err
	}
	start := make(chan struct{})
	var attachErr, deleteErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		<-start
		_, attachErr = r.AttachManifest(bg(), lease, data, nil)
	})
	wg.Go(func() {
		<-start
		deleteErr = r.Delete(bg(), rec.ID)
	})
	close(start)
	wg.Wait()
	if err := lease.End(); err != nil {
		return "", err
	}
	if deleteErr != nil {
		return "", fmt.Errorf("Delete: %w", deleteErr)
	}
	outcome := "attach first"
	if attachErr != nil {
		if !errors.Is(attachErr, repository.ErrNotFound) {
			return "", fmt.Errorf("AttachManifest: %w", attachErr)
		}
		outcome = "delete first"
	}
	for _, path := range []string{r.paths.recordPath(rec.ID), r.paths.snapshotDir(rec.ID), r.paths.recordLockPath(rec.ID), r.paths.leasePath(rec.ID)} {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("%s exists after the race (%v)", path, err)
		}
	}
	return outcome, nil
}

// assertGone checks on disk that nothing of snapshot id remains (lease
// files aside: they exist while a lease is held).
func assertGone(t *testing.T, r *Repo, id string) {
	t.Helper()
	for _, path := range []string{r.paths.recordPath(id), r.paths.snapshotDir(id), r.paths.recordLockPath(id)} {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s exists after delete (%v)", path, err)
		}
	}
}

// assertNoLease checks that no lease file of id is left.
func assertNoLease(t *testing.T, r *Repo, id string) {
	t.Helper()
	if _, err := os.Lstat(r.paths.leasePath(id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lease file of %s left (%v)", id, err)
	}
}

// An artifact replaced by something that is not a regular file is refused
// naming what it is, not by the size of the entry itself (a symlink's
// target path, a directory's blocks).
func TestResolveNamesANonRegularArtifact(t *testing.T) {
	for _, kind := range []string{"symlink", "FIFO", "directory"} {
		t.Run(kind, func(t *testing.T) {
			r := openTemp(t, Options{})
			in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
			rec := publishWith(t, r, in, nil)
			path := r.paths.artifactPath(rec.ID, repository.MemoryFileName)
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			var err error
			switch kind {
			case "symlink":
				err = os.Symlink(in.MemoryPath, path)
			case "FIFO":
				err = syscall.Mkfifo(path, 0o600)
			case "directory":
				err = os.Mkdir(path, 0o700)
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = r.Resolve(bg(), rec.ID)
			var ie *repository.IntegrityError
			if !errors.As(err, &ie) || ie.Got != "a "+kind || !strings.Contains(ie.Want, "regular file") {
				t.Fatalf("Resolve = %v, want an integrity error naming a %s", err, kind)
			}
		})
	}
}

func TestLayersContract(t *testing.T) {
	t.Parallel()
	repotest.RunLayers(t, func(t *testing.T) repository.Repository { return openTemp(t, Options{}) })
}

func TestLayersContractCopying(t *testing.T) {
	t.Parallel()
	repotest.RunLayers(t, func(t *testing.T) repository.Repository { return openTemp(t, Options{ForceCopy: true}) })
}
