package posixfs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// replaceWith swaps the catalog file at path for something that is not a
// regular file.
func replaceWith(t *testing.T, path, kind, target string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	var err error
	switch kind {
	case "directory":
		err = os.Mkdir(path, 0o755)
	case "symlink":
		err = os.Symlink(target, path)
	case "FIFO":
		err = syscall.Mkfifo(path, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func wantDamage(t *testing.T, r *Repo, kind, name string, quarantined bool) {
	t.Helper()
	found, err := r.Damaged(bg())
	if err != nil {
		t.Fatalf("Damaged: %v", err)
	}
	for _, d := range found {
		if d.Kind == kind && d.Name == name && d.Quarantined == quarantined {
			return
		}
	}
	t.Fatalf("Damaged = %+v; want %s %s (quarantined %v)", found, kind, name, quarantined)
}

// An alias that is not a regular file is damage: listed, quarantined by
// a writable open's sweep (which must not fail), and released by deleting
// its snapshot.
func TestAliasNotARegularFileIsDamage(t *testing.T) {
	for _, kind := range []string{"directory", "symlink", "FIFO"} {
		t.Run(kind, func(t *testing.T) {
			r := openTemp(t, Options{})
			rec, _ := repotest.Publish(t, r, "ref")
			replaceWith(t, r.paths.aliasPath("ref"), kind, r.paths.recordPath(rec.ID))
			if _, err := r.readAlias("ref"); !errors.Is(err, repository.ErrIntegrity) {
				t.Fatalf("readAlias = %v, want ErrIntegrity", err)
			}
			wantDamage(t, r, repository.DamageAlias, "ref", false)
			w, err := Open(r.Root(), Options{})
			if err != nil {
				t.Fatalf("writable open with a %s alias: %v", kind, err)
			}
			wantDamage(t, w, repository.DamageAlias, "ref", true)
			if _, err := repository.DeleteRef(bg(), w, rec.ID); err != nil {
				t.Fatalf("delete %s: %v", rec.ID, err)
			}
			if found, err := w.Damaged(bg()); err != nil || len(found) != 0 {
				t.Fatalf("after delete, Damaged = %+v, %v", found, err)
			}
		})
	}
}

// A record that is not a regular file is damage: listed, quarantined,
// and deletable by its id.
func TestRecordNotARegularFileIsDamage(t *testing.T) {
	for _, kind := range []string{"directory", "symlink", "FIFO"} {
		t.Run(kind, func(t *testing.T) {
			r := openTemp(t, Options{})
			rec, _ := repotest.Publish(t, r, "ref")
			other, _ := repotest.Publish(t, r, "other")
			replaceWith(t, r.paths.recordPath(rec.ID), kind, r.paths.recordPath(other.ID))
			if _, err := r.Get(bg(), rec.ID); !errors.Is(err, repository.ErrIntegrity) {
				t.Fatalf("Get = %v, want ErrIntegrity", err)
			}
			wantDamage(t, r, repository.DamageRecord, rec.ID, false)
			if _, err := repository.DeleteRef(bg(), r, rec.ID); err != nil {
				t.Fatalf("delete %s in place: %v", rec.ID, err)
			}
			if found, err := r.Damaged(bg()); err != nil || len(found) != 0 {
				t.Fatalf("after delete, Damaged = %+v, %v", found, err)
			}
			if _, err := os.Lstat(r.paths.snapshotDir(rec.ID)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("artifacts remain: %v", err)
			}
			// The alias it held is free again.
			repotest.Publish(t, r, "ref")
		})
	}
}

// A record that is a directory is quarantined by the sweep and then
// deleted from the quarantine by its id.
func TestRecordDirectoryQuarantinedThenDeleted(t *testing.T) {
	r := openTemp(t, Options{})
	rec, _ := repotest.Publish(t, r, "ref")
	replaceWith(t, r.paths.recordPath(rec.ID), "directory", "")
	w, err := Open(r.Root(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantDamage(t, w, repository.DamageRecord, rec.ID, true)
	if _, err := repository.DeleteRef(bg(), w, rec.ID); err != nil {
		t.Fatalf("delete %s: %v", rec.ID, err)
	}
	if found, err := w.Damaged(bg()); err != nil || len(found) != 0 {
		t.Fatalf("after delete, Damaged = %+v, %v", found, err)
	}
}

// An alias symlinked out of the store is never read through.
func TestAliasSymlinkNotFollowed(t *testing.T) {
	r := openTemp(t, Options{})
	repotest.Publish(t, r, "ref")
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("secret-bytes-outside\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	replaceWith(t, r.paths.aliasPath("ref"), "symlink", outside)
	_, err := r.readAlias("ref")
	if !errors.Is(err, repository.ErrIntegrity) || strings.Contains(err.Error(), "secret-bytes") {
		t.Fatalf("readAlias = %v; want ErrIntegrity not quoting the target", err)
	}
}

// A leftover the sweep cannot remove (an immutable file) is left and
// reported to Warn, naming it; the writable open still succeeds.
func TestSweepFailureDoesNotFailOpen(t *testing.T) {
	if _, err := exec.LookPath("chattr"); err != nil {
		t.Skip("chattr not installed")
	}
	r := openTemp(t, Options{})
	rec, lease := repotest.Publish(t, r, "ref")
	lease.End()
	mem := filepath.Join(r.paths.snapshotDir(rec.ID), "memory.bin")
	if _, err := os.Lstat(mem); err != nil {
		t.Fatalf("no memory artifact at %s: %v", mem, err)
	}
	if out, err := exec.Command("chattr", "+i", mem).CombinedOutput(); err != nil {
		t.Skipf("this file system refuses FS_IOC_SETFLAGS (chattr +i): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-i", mem).Run() })
	// The delete removes record and alias, then fails on the artifact.
	if _, err := repository.DeleteRef(bg(), r, "ref"); err == nil {
		t.Fatal("delete of an immutable artifact succeeded")
	}
	var warned []error
	w, err := Open(r.Root(), Options{Warn: func(err error) { warned = append(warned, err) }})
	if err != nil {
		t.Fatalf("writable open with an undeletable leftover: %v", err)
	}
	if len(warned) != 1 || !strings.Contains(warned[0].Error(), rec.ID) {
		t.Errorf("warnings %v; want one naming the leftover of %s", warned, rec.ID)
	}
	repotest.Publish(t, w, "ref")
}
