package posixfs

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/integrity"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// Cross-process tests re-execute this test binary as a child (TestMain
// hands it to childMain), through repotest's child machinery: the
// scenarios every backend shares run in TestCrossProcess, and this file
// keeps what only a POSIX store has: flocks held by a process that is
// killed, and SIGKILL at every fault point.

// childMain runs a child's role on the store the parent named, with the
// fault point FaultPointEnv names armed.
func childMain(role string) int {
	open := func(_ context.Context, store string) (repository.Repository, func(), error) {
		repo, err := Open(store, Options{})
		if err != nil {
			return nil, nil, err
		}
		repo.faultHook = faultHookFromEnv()
		return repo, func() {}, nil
	}
	return repotest.ChildMain(role, open, map[string]repotest.Role{
		"attach-digests":    childAttachDigests,
		"attach-refinement": childAttachRefinement,
		"hold-record-lock":  childHoldRecordLock,
	})
}

// childAttachDigests attaches the digest table of other bytes of the
// memory file's size: a table the record does not have yet, so replacing
// it passes every fault point.
func childAttachDigests(ctx context.Context, repo repository.Repository) int {
	id := os.Getenv(repotest.ChildIDEnv)
	lease, err := repo.LeaseExisting(ctx, id)
	if err != nil {
		return repotest.Report(err)
	}
	defer lease.End()
	rec, err := repo.Get(ctx, id)
	if err != nil {
		return repotest.Report(err)
	}
	mem := make([]byte, rec.MemorySize)
	_, _ = rand.Read(mem)
	b := integrity.NewBuilder(integrity.CRC32C, rec.MemorySize)
	b.Write(mem)
	table := b.Table().Encode()
	fmt.Printf("ready %s\n", repotest.SHA256Hex(table))
	repotest.WaitBarrier()
	_, err = repo.AttachDigests(ctx, lease, table)
	return repotest.Report(err)
}

// childAttachRefinement attaches a refinement of random parts grown from
// the snapshot's manifest, after saying its file's SHA-256.
func childAttachRefinement(ctx context.Context, repo repository.Repository) int {
	id := os.Getenv(repotest.ChildIDEnv)
	lease, err := repo.LeaseExisting(ctx, id)
	if err != nil {
		return repotest.Report(err)
	}
	defer lease.End()
	rec, err := repo.Get(ctx, id)
	if err != nil || rec.Manifest == nil || rec.Refinement == nil {
		return repotest.Report(fmt.Errorf("snapshot %s has no manifest and refinement: %w", id, err))
	}
	parts := make([]byte, 500)
	_, _ = rand.Read(parts)
	ref := repository.Refinement{BaseSHA256: rec.Manifest.SHA256, PreviousSHA256: rec.Refinement.SHA256, Restores: 7,
		Manifest: parts[:200], State: parts[200:]}
	a, err := repository.RefinementAttachment(ref)
	if err != nil {
		return repotest.Report(err)
	}
	fmt.Printf("ready %s\n", a.RefinementDescriptor().SHA256)
	repotest.WaitBarrier()
	_, err = repo.AttachRefinement(ctx, lease, ref)
	return repotest.Report(err)
}

// childHoldRecordLock takes the record lock of the snapshot and holds it
// until killed (or until the parent goes away).
func childHoldRecordLock(ctx context.Context, repo repository.Repository) int {
	r := repo.(*Repo)
	l, err := acquireLock(ctx, r.paths.recordLockPath(os.Getenv(repotest.ChildIDEnv)), lockExclusive)
	if err != nil {
		return repotest.Report(err)
	}
	defer l.release()
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return repotest.ExitOK
}

// TestCrossProcess runs the cross-process scenarios every backend shares
// on stores of this backend.
func TestCrossProcess(t *testing.T) {
	repotest.RunCrossProcess(t, repotest.CrossProcess{
		Open: func(t *testing.T) (repository.Repository, string) {
			r := openTemp(t, Options{})
			return r, r.Root()
		},
		AssertGone:    func(t *testing.T, r repository.Repository, id string) { assertGone(t, r.(*Repo), id) },
		AssertNoLease: func(t *testing.T, r repository.Repository, id string) { assertNoLease(t, r.(*Repo), id) },
		// A dead publisher's lease lock is free at once: the sweep a
		// writer's open runs reclaims its directory.
		Reclaim: func(t *testing.T, r repository.Repository) {
			if err := r.(*Repo).Sweep(bg()); err != nil {
				t.Fatal(err)
			}
		},
		AliasRounds:        8,
		Publishers:         2,
		AttachDeleteRounds: 15,
	})
}

// TestKilledLockHolderDoesNotBlock kills a process holding a record lock
// and checks the next caller gets it.
func TestKilledLockHolderDoesNotBlock(t *testing.T) {
	r := openTemp(t, Options{})
	rec, _ := repotest.Publish(t, r, "locked")
	c := repotest.StartChild(t, "hold-record-lock", r.Root(), map[string]string{repotest.ChildIDEnv: rec.ID}, nil)
	c.Ready(t)

	// While the holder lives, Delete waits for it.
	ctx, cancel := context.WithTimeout(bg(), 50*time.Millisecond)
	err := r.Delete(ctx, rec.ID)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Delete while another process holds the lock = %v, want DeadlineExceeded", err)
	}
	if _, err := r.Get(bg(), rec.ID); err != nil {
		t.Fatalf("the blocked Delete changed something: %v", err)
	}

	if err := c.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, sig := c.Wait(t); sig != syscall.SIGKILL {
		t.Fatalf("holder ended with signal %v", sig)
	}
	ctx, cancel = context.WithTimeout(bg(), repotest.ChildTimeout)
	defer cancel()
	if err := r.Delete(ctx, rec.ID); err != nil {
		t.Fatalf("Delete after the holder was killed: %v", err)
	}
	assertGone(t, r, rec.ID)
}

// TestCrashAtEveryFaultPoint kills a child with SIGKILL at each step of
// publish, both attaches and delete, then checks that readers see a whole snapshot
// or none, that Open sweeps the debris away, that no lock is stuck, and that
// the alias can be published again.
func TestCrashAtEveryFaultPoint(t *testing.T) {
	t.Parallel()
	for _, point := range FaultPoints {
		t.Run(point, func(t *testing.T) {
			store := filepath.Join(t.TempDir(), "store")
			r, err := Open(store, Options{})
			if err != nil {
				t.Fatal(err)
			}
			env := map[string]string{FaultPointEnv: point}
			var role, childID string
			var before repository.Record
			switch {
			case strings.HasPrefix(point, "publish."):
				role = "publish"
				for k, v := range repotest.PublishEnv(repotest.NewInputs(t, repotest.SmallMemoryBytes), "crash") {
					env[k] = v
				}
			case strings.HasPrefix(point, "attach."):
				role = "attach"
				var lease repository.Lease
				before, lease = repotest.Publish(t, r, "crash")
				// An earlier manifest, so replacing it passes every point.
				desc, err := r.AttachManifest(bg(), lease, []byte("first manifest"), nil)
				if err != nil {
					t.Fatal(err)
				}
				before.Manifest = &desc
				if err := lease.End(); err != nil {
					t.Fatal(err)
				}
				env[repotest.ChildIDEnv] = before.ID
			case strings.HasPrefix(point, "attach-digests."):
				role = "attach-digests"
				var lease repository.Lease
				before, lease = repotest.Publish(t, r, "crash")
				if err := lease.End(); err != nil {
					t.Fatal(err)
				}
				env[repotest.ChildIDEnv] = before.ID
			case strings.HasPrefix(point, "attach-refinement."):
				role = "attach-refinement"
				before = publishRefined(t, r)
				env[repotest.ChildIDEnv] = before.ID
			case strings.HasPrefix(point, "delete."):
				role = "delete"
				var lease repository.Lease
				before, lease = repotest.Publish(t, r, "crash")
				if err := lease.End(); err != nil {
					t.Fatal(err)
				}
				env[repotest.ChildIDEnv] = before.ID
			}
			c := repotest.StartChild(t, role, store, env, nil)
			childSays := c.Ready(t)
			if role == "publish" {
				childID = childSays
			}
			if code, sig := c.Wait(t); sig != syscall.SIGKILL {
				t.Fatalf("child was not killed at %s: exit %d, stderr: %s", point, code, c.Stderr())
			}

			// Readers that do not sweep first must already see a
			// consistent store.
			reader := &Repo{paths: r.paths}
			checkConsistent(t, reader)
			switch role {
			case "publish":
				rec, err := reader.Get(bg(), childID)
				visible := point == FaultPublishAfterRecord
				if visible != (err == nil) {
					t.Fatalf("after a crash at %s Get = %+v, %v; want visible=%v", point, rec, err, visible)
				}
				if err != nil && !errors.Is(err, repository.ErrNotFound) {
					t.Fatal(err)
				}
			case "attach":
				rec, err := reader.Get(bg(), before.ID)
				if err != nil {
					t.Fatal(err)
				}
				// Before the new record lands the old descriptor is gone;
				// after, the new one is there; never the old descriptor
				// with new bytes.
				switch {
				case point == FaultAttachAfterRecord && (rec.Manifest == nil || rec.Manifest.SHA256 != childSays):
					t.Fatalf("after %s the record has %+v, want the child's manifest %s", point, rec.Manifest, childSays)
				case point != FaultAttachAfterRecord && rec.Manifest != nil:
					t.Fatalf("after %s the record still has a descriptor %+v", point, rec.Manifest)
				}
			case "attach-digests":
				rec, err := reader.Get(bg(), before.ID)
				if err != nil {
					t.Fatal(err)
				}
				// As for the manifest: no descriptor until the new record
				// lands, then the child's.
				switch {
				case point == FaultDigestsAfterRecord && (rec.MemoryDigests == nil || rec.MemoryDigests.SHA256 != childSays):
					t.Fatalf("after %s the record has %+v, want the child's table %s", point, rec.MemoryDigests, childSays)
				case point != FaultDigestsAfterRecord && rec.MemoryDigests != nil:
					t.Fatalf("after %s the record still has a descriptor %+v", point, rec.MemoryDigests)
				}
			case "attach-refinement":
				rec, err := reader.Get(bg(), before.ID)
				if err != nil {
					t.Fatal(err)
				}
				// The old pair until the new record lands, then the new.
				want := before.Refinement.SHA256
				if point == FaultRefineAfterRecord {
					want = childSays
				}
				if rec.Refinement == nil || rec.Refinement.SHA256 != want || *rec.Manifest != *before.Manifest {
					t.Fatalf("after %s the record has %+v, want refinement %s", point, rec.Refinement, want)
				}
			case "delete":
				if _, err := reader.Get(bg(), before.ID); !errors.Is(err, repository.ErrNotFound) {
					t.Fatalf("after %s the record is visible: %v", point, err)
				}
				if _, err := reader.ResolveAlias(bg(), "crash"); !errors.Is(err, repository.ErrNotFound) {
					t.Fatalf("after %s the alias resolves: %v", point, err)
				}
			}

			// Open sweeps; afterwards only whole snapshots remain, and no
			// lock is stuck: every operation below would block otherwise.
			r, err = Open(store, Options{})
			if err != nil {
				t.Fatal(err)
			}
			checkConsistent(t, r)
			checkSwept(t, r)
			ctx, cancel := context.WithTimeout(bg(), repotest.ChildTimeout)
			defer cancel()
			if role == "attach" {
				lease, err := r.LeaseExisting(ctx, before.ID)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := r.AttachManifest(ctx, lease, []byte("after the crash"), nil); err != nil {
					t.Fatalf("attach after a crash at %s: %v", point, err)
				}
				_ = lease.End()
			}
			if role == "attach-digests" {
				lease, err := r.LeaseExisting(ctx, before.ID)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := r.AttachDigests(ctx, lease, repotest.DigestTable(t, r.paths.artifactPath(before.ID, repository.MemoryFileName))); err != nil {
					t.Fatalf("attach digests after a crash at %s: %v", point, err)
				}
				_ = lease.End()
			}
			if holder, err := r.ResolveAlias(ctx, "crash"); err == nil {
				if err := r.Delete(ctx, holder); err != nil {
					t.Fatal(err)
				}
			}
			lease, err := r.BeginCapture(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.End()
			if _, err := r.Publish(ctx, lease, repotest.NewInputs(t, repotest.SmallMemoryBytes).Request("crash")); err != nil {
				t.Fatalf("publishing the alias again after a crash at %s: %v", point, err)
			}
		})
	}
}

// checkConsistent asserts that every listed snapshot is whole: its
// artifacts are there with the recorded sizes and digests, an attached
// manifest matches its descriptor, and its alias resolves to it.
func checkConsistent(t *testing.T, r *Repo) {
	t.Helper()
	recs, err := r.List(bg(), repository.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		res, err := r.Resolve(bg(), rec.ID)
		if err != nil {
			t.Fatalf("listed snapshot %s does not resolve: %v", rec.ID, err)
		}
		if (!rec.Layered() && repotest.FileSHA256(t, res.MemoryPath) != rec.MemorySHA256) || repotest.FileSHA256(t, res.VMStatePath) != rec.VMStateSHA256 {
			t.Fatalf("snapshot %s: artifacts do not match the record", rec.ID)
		}
		if rec.Manifest != nil && repotest.FileSHA256(t, res.ManifestPath) != rec.Manifest.SHA256 {
			t.Fatalf("snapshot %s: manifest does not match its descriptor", rec.ID)
		}
		if rec.Refinement != nil && repotest.FileSHA256(t, res.RefinementPath) != rec.Refinement.SHA256 {
			t.Fatalf("snapshot %s: refinement does not match its descriptor", rec.ID)
		}
		if rec.MemoryDigests != nil && repotest.FileSHA256(t, res.DigestsPath) != rec.MemoryDigests.SHA256 {
			t.Fatalf("snapshot %s: digest table does not match its descriptor", rec.ID)
		}
		if rec.Alias != "" {
			if id, err := r.ResolveAlias(bg(), rec.Alias); err != nil || id != rec.ID {
				t.Fatalf("snapshot %s: alias %s resolves to %s, %v", rec.ID, rec.Alias, id, err)
			}
		}
	}
}

// checkSwept asserts that no temporary file, orphan directory, stale alias
// or lock file is left.
func checkSwept(t *testing.T, r *Repo) {
	t.Helper()
	for _, rel := range storeFiles(t, r.Root()) {
		name := filepath.Base(strings.TrimSuffix(rel, "/"))
		switch {
		case strings.HasSuffix(name, tempSuffix):
			t.Errorf("temporary file left: %s", rel)
		case strings.HasSuffix(name, lockSuffix):
			t.Errorf("lock file left: %s", rel)
		case repository.IsRefinementFile(name):
			rec, err := r.Get(bg(), filepath.Base(filepath.Dir(rel)))
			if err != nil || rec.Refinement == nil || name != repository.RefinementFileName(rec.Refinement.SHA256) {
				t.Errorf("refinement file no record names left: %s", rel)
			}
		case strings.HasPrefix(rel, snapshotsDirName+"/") && strings.Count(rel, "/") == 2 && strings.HasSuffix(rel, "/"):
			if ok, _ := r.recordExists(name); !ok {
				t.Errorf("directory of an unpublished snapshot left: %s", rel)
			}
		case strings.HasPrefix(rel, catalogDirName+"/"+aliasesDirName+"/") && !strings.HasSuffix(rel, "/"):
			if _, err := r.ResolveAlias(bg(), name); err != nil {
				t.Errorf("stale alias left: %s (%v)", rel, err)
			}
		}
	}
}

// publishRefined publishes a snapshot with a manifest and a first
// refinement, so that a second one replaces it at every fault point.
func publishRefined(t *testing.T, r *Repo) repository.Record {
	t.Helper()
	rec, lease := repotest.Publish(t, r, "crash")
	defer lease.End()
	base := []byte("recorded manifest")
	m, err := r.AttachManifest(bg(), lease, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := r.AttachRefinement(bg(), lease, repotest.RefinementOf(t, base, 1))
	if err != nil {
		t.Fatal(err)
	}
	rec.Manifest, rec.Refinement = &m, &d
	return rec
}
