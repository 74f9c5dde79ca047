package restore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/lab/synth"
	"warmstart/internal/manifest"
	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
	"warmstart/internal/snapcheck"
)

// The corruption sweep: every artifact of a published snapshot, damaged in
// every way a disk, an operator or a stray script damages files, restored on
// both devices with prefetch on and off. A restore either fails with an
// error naming the snapshot or the guest reads exactly the published bytes;
// it never reads anything else.

// corruption damages the artifact at path; other is the same artifact of
// another snapshot of the same size.
type corruption struct {
	name  string
	apply func(t *testing.T, c corruptCase)
}

type corruptCase struct {
	path, other  string
	touched      int64 // a page the guest touches
	untouched    int64 // a page next to one it touches that it never touches
	artifactSize int64
}

var corruptions = []corruption{
	{"flip touched page", func(t *testing.T, c corruptCase) { repotest.FlipBytes(t, c.path, c.touched+123) }},
	{"flip untouched page", func(t *testing.T, c corruptCase) { repotest.FlipBytes(t, c.path, c.untouched+7) }},
	{"other snapshot's file", func(t *testing.T, c corruptCase) { copyFile(t, c.other, c.path) }},
	{"truncate", func(t *testing.T, c corruptCase) { must(t, os.Truncate(c.path, c.artifactSize/2)) }},
	{"append", func(t *testing.T, c corruptCase) { appendBytes(t, c.path, 4096) }},
	{"symlink", func(t *testing.T, c corruptCase) {
		copy := c.path + ".copy"
		copyFile(t, c.path, copy)
		must(t, os.Remove(c.path))
		must(t, os.Symlink(copy, c.path))
		t.Cleanup(func() { os.Remove(copy) })
	}},
	{"fifo", func(t *testing.T, c corruptCase) {
		must(t, os.Remove(c.path))
		must(t, syscall.Mkfifo(c.path, 0o600))
	}},
	{"remove", func(t *testing.T, c corruptCase) { must(t, os.Remove(c.path)) }},
}

// outcome is what a restore of a damaged snapshot must do.
type outcome int

const (
	mayFail     outcome = iota // fail clearly, or read the published bytes
	mustFail                   // fail with an integrity error or a missing artifact
	mustSucceed                // read the published bytes
)

func expectedOutcome(artifact, damage string) outcome {
	switch {
	case artifact == repository.ManifestFileName:
		return mustSucceed // a bad manifest means on-demand reads
	case artifact == repository.MemoryFileName && damage == "flip untouched page":
		return mustSucceed
	}
	return mustFail
}

func TestCorruptionSweep(t *testing.T) {
	e := newEnv(t, envOptions{})
	other := otherSnapshot(t, e)
	touched, untouched := pagesOf(t, e)
	dir := filepath.Dir(e.memoryPath(t))
	artifacts := map[string]string{
		repository.MemoryFileName:   other.Memory,
		repository.VMStateFileName:  other.VMState,
		repository.DigestsFileName:  other.Digests,
		repository.ManifestFileName: other.Manifest,
	}
	for artifact, otherPath := range artifacts {
		for _, damage := range corruptions {
			t.Run(artifact+"/"+damage.name, func(t *testing.T) {
				path := filepath.Join(dir, artifact)
				backup, putBack := setAside(t, path)
				defer putBack()
				fi, err := os.Stat(backup)
				must(t, err)
				copyFile(t, backup, path)
				c := corruptCase{path: path, other: otherPath, artifactSize: fi.Size()}
				if artifact == repository.MemoryFileName {
					c.touched, c.untouched = touched, untouched
				} else {
					c.touched, c.untouched = 0, fi.Size()/2
				}
				damage.apply(t, c)
				want := expectedOutcome(artifact, damage.name)
				for _, device := range devices {
					for _, mode := range []restore.Mode{restore.ModeOn, restore.ModeOff} {
						e.checkDamagedRestore(t, device, mode, want)
					}
				}
				if artifact == repository.MemoryFileName && damage.name == "flip untouched page" {
					e.checkVerifyReports(t, untouched)
				}
			})
		}
	}
}

// checkDamagedRestore resolves and restores the snapshot and checks the
// outcome: never a guest that read other bytes than the published ones.
func (e *env) checkDamagedRestore(t *testing.T, device string, mode restore.Mode, want outcome) {
	t.Helper()
	what := fmt.Sprintf("%s device, prefetch %s", device, mode)
	started := len(e.vm.all())
	inst, err := e.resolveAndRestore(device, mode)
	if err != nil {
		if want == mustSucceed {
			t.Errorf("%s: restore failed: %v", what, err)
		} else if !strings.Contains(err.Error(), e.id) {
			t.Errorf("%s: error %q does not name the snapshot", what, err)
		} else if n := strings.Count(err.Error(), "restore "+e.id); n > 1 {
			t.Errorf("%s: error %q says which restore failed %d times", what, err, n)
		}
		if vms := e.vm.all(); len(vms) > started {
			checkGone(t, vms[len(vms)-1])
		}
		return
	}
	defer stop(t, inst)
	if want == mustFail {
		t.Errorf("%s: restore of a damaged snapshot succeeded", what)
	}
	checkHash(t, inst, e.ref.expected)
}

// checkVerifyReports fails unless snapshot verify names the block at off
// as bad, and only that block.
func (e *env) checkVerifyReports(t *testing.T, off int64) {
	t.Helper()
	rep, err := snapcheck.Verify(context.Background(), e.repo, e.id, snapcheck.Options{})
	must(t, err)
	for _, a := range rep.Artifacts {
		if a.Name != repository.MemoryFileName {
			continue
		}
		if a.Blocks == nil || len(a.Blocks.BadRanges) != 1 || a.Blocks.BadRanges[0].Offset != off || a.Blocks.Bad != 1 {
			t.Fatalf("snapshot verify reports memory blocks %+v, want exactly the block at %d", a.Blocks, off)
		}
		if rep.OK {
			t.Fatal("snapshot verify says a snapshot with a bad block is OK")
		}
		return
	}
	t.Fatal("snapshot verify does not report memory.bin")
}

func (e *env) resolveAndRestore(device string, mode restore.Mode) (*restore.Instance, error) {
	res, err := e.repo.Resolve(context.Background(), e.id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	return e.restorer.Restore(ctx, restore.SourceOf(res), restore.Options{Device: device, Prefetch: mode})
}

// A flipped byte in a page the guest touches fails the restore with an
// integrity error that names the snapshot and the block, counted once and
// logged, on both devices.
func TestCorruptTouchedPageNamesTheBlock(t *testing.T) {
	e := newEnv(t, envOptions{})
	touched, _ := pagesOf(t, e)
	path := e.memoryPath(t)
	backup, putBack := setAside(t, path)
	defer putBack()
	copyFile(t, backup, path)
	repotest.FlipBytes(t, path, touched+100)
	for _, device := range devices {
		for _, mode := range []restore.Mode{restore.ModeOn, restore.ModeOff} {
			before := e.observer.integrityFailures()
			_, err := e.resolveAndRestore(device, mode)
			if !errors.Is(err, repository.ErrIntegrity) {
				t.Fatalf("%s/%s: restore = %v, want an integrity error", device, mode, err)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("offset %d", touched)) || !strings.Contains(err.Error(), e.id) {
				t.Errorf("%s/%s: error %q names neither the snapshot and the block at %d", device, mode, err, touched)
			}
			if got := e.observer.integrityFailures() - before; got < 1 {
				t.Errorf("%s/%s: %d integrity failures counted, want at least 1", device, mode, got)
			}
			if !strings.Contains(strings.Join(e.log.Take(), "\n"), "integrity check failed") {
				t.Errorf("%s/%s: no log line says the check failed", device, mode)
			}
		}
	}
}

// otherFiles are the artifacts of another snapshot of the same size.
type otherFiles struct{ Memory, VMState, Digests, Manifest string }

func otherSnapshot(t *testing.T, e *env) otherFiles {
	t.Helper()
	paths, err := synth.Generate(context.Background(), synth.Options{MemoryBytes: memoryBytes, Seed: referenceSeed + 1, Dir: t.TempDir()})
	must(t, err)
	lease, err := e.repo.BeginCapture(context.Background())
	must(t, err)
	defer lease.End()
	rec, err := e.repo.Publish(context.Background(), lease, repository.PublishRequest{
		VMStatePath: paths.VMState, MemoryPath: paths.Memory, Layout: e.ref.layout,
	})
	must(t, err)
	// A manifest of the same size and layout as the reference's, with
	// other ranges: the reference's ranges shifted by one page.
	_, err = e.repo.AttachManifest(context.Background(), lease, shiftedManifest(t, e), nil)
	must(t, err)
	res, err := e.repo.Resolve(context.Background(), rec.ID)
	must(t, err)
	vmState := filepath.Join(t.TempDir(), "vm_state.bin")
	copyFile(t, e.source(t).VMStatePath, vmState)
	repotest.FlipBytes(t, vmState, 0) // same size, other bytes
	return otherFiles{Memory: res.MemoryPath, VMState: vmState, Digests: res.DigestsPath, Manifest: res.ManifestPath}
}

func shiftedManifest(t *testing.T, e *env) []byte {
	t.Helper()
	m := e.manifest(t)
	var offsets []int64
	for _, r := range m.Ranges {
		for off := r.Offset; off < r.Offset+r.Length; off += 4096 {
			offsets = append(offsets, off)
		}
	}
	for i := range offsets {
		offsets[i] = (offsets[i] + 4096) % memoryBytes
	}
	return buildManifest(t, e, offsets)
}

// pagesOf returns a page the guest touches and an untouched page right next
// to a touched one, so that the file device's readaround reads it.
func pagesOf(t *testing.T, e *env) (touched, untouched int64) {
	t.Helper()
	seen := map[int64]bool{}
	for _, en := range e.ref.entries {
		seen[en.Offset] = true
	}
	for _, en := range e.ref.entries[len(e.ref.entries)/3:] {
		if next := en.Offset + 4096; !seen[next] && next < memoryBytes && isNonZero(t, e, next) {
			return en.Offset, next
		}
	}
	t.Fatal("no untouched non-zero page next to a touched one")
	return 0, 0
}

func isNonZero(t *testing.T, e *env, off int64) bool {
	t.Helper()
	f, err := os.Open(e.ref.paths.Memory)
	must(t, err)
	defer f.Close()
	buf := make([]byte, 4096)
	_, err = f.ReadAt(buf, off)
	must(t, err)
	for _, b := range buf {
		if b != 0 {
			return true
		}
	}
	return false
}

// setAside moves the file at path out of the way and returns where it is
// kept and a function that puts it back, removing whatever a test left at
// path (a file, a symlink, a FIFO).
func setAside(t *testing.T, path string) (backup string, putBack func()) {
	t.Helper()
	backup = filepath.Join(t.TempDir(), filepath.Base(path))
	copyFile(t, path, backup)
	must(t, os.Remove(path))
	return backup, func() {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Error(err)
		}
		copyFile(t, backup, path)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	must(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o444)
	must(t, err)
	_, err = io.Copy(out, in)
	must(t, errors.Join(err, out.Close()))
}

func appendBytes(t *testing.T, path string, n int) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	must(t, err)
	_, err = f.Write(make([]byte, n))
	must(t, errors.Join(err, f.Close()))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func buildManifest(t *testing.T, e *env, offsets []int64) []byte {
	t.Helper()
	m, err := manifest.Build(e.ref.layout, offsets)
	must(t, err)
	data, err := manifest.Encode(m)
	must(t, err)
	return data
}

// A snapshot published before digest tables existed (a record of format
// 1) restores, unverified, and the restorer says so once, not on every
// restore.
func TestNoDigestsWarnsOnce(t *testing.T) {
	e := newEnv(t, envOptions{})
	src := e.source(t)
	legacy := *src.Record
	legacy.Format, legacy.MemoryFormat, legacy.MemoryDigests, legacy.MemorySHA256Digests = 1, "", nil, nil
	src.Record, src.Digests, src.DigestsPath, src.SHA256Digests, src.SHA256DigestsPath = &legacy, nil, "", nil, ""
	for _, device := range devices {
		inst := e.restore(t, e.restorer, src, restore.Options{Device: device, Prefetch: restore.ModeOn})
		checkHash(t, inst, e.ref.expected)
		stop(t, inst)
	}
	lines := 0
	for _, l := range e.log.Take() {
		if strings.Contains(l, "no digest table") && strings.Contains(l, e.id) {
			lines++
		}
	}
	if lines != 1 {
		t.Fatalf("%d log lines say the snapshot is unverified, want 1", lines)
	}
}

// A digest table missing from a snapshot that is still there is damage
// and counted as an integrity failure; missing because the snapshot was
// deleted while the restore ran (Source.Gone says so) it is not. Both
// restores fail, naming the file.
func TestMissingDigestTableCountsUnlessTheSnapshotWentAway(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, c := range []struct {
		name      string
		gone      func() bool
		wantCount int
	}{
		{"no Gone", nil, 1},
		{"still there", func() bool { return false }, 1},
		{"deleted", func() bool { return true }, 0},
	} {
		src := e.source(t)
		src.DigestsPath = filepath.Join(t.TempDir(), "memory.digests")
		src.Gone = c.gone
		before := e.observer.integrityFailures()
		inst, err := e.restorer.Restore(context.Background(), src, restore.Options{Device: config.DeviceFile, Prefetch: restore.ModeOff})
		if err == nil {
			stop(t, inst)
			t.Fatalf("%s: restore without its digest table succeeded", c.name)
		}
		if !strings.Contains(err.Error(), src.DigestsPath) {
			t.Errorf("%s: error does not name the missing file: %v", c.name, err)
		}
		if got := e.observer.integrityFailures() - before; got != c.wantCount {
			t.Errorf("%s: %d integrity failures counted, want %d", c.name, got, c.wantCount)
		}
	}
}
