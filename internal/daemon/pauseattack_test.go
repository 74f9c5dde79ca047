package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/ops"
	"warmstart/internal/pause"
	"warmstart/internal/repository"
	"warmstart/internal/snapcheck"

	"warmstart/internal/repository/posixfs"

	"golang.org/x/sys/unix"
)

// rawPause posts body to the pause endpoint of restore id and returns
// the status and the answer's text.
func rawPause(t *testing.T, r *running, id, body string) (int, string) {
	t.Helper()
	hc := rawClient(t, strings.TrimPrefix(r.d.Endpoint(), "unix:"))
	req, err := http.NewRequest(http.MethodPost, "http://daemon/restores/"+id+"/snapshot", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(text)
}

// TestPauseBadInputIsTheClients: every malformed or impossible pause is
// answered with the client's status (never a 500 "internal error") and
// leaves the restore pausable: a pause afterwards publishes a child that
// holds every page the guest wrote.
func TestPauseBadInputIsTheClients(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r, imp, in := pausableRestore(t, f, nil)
	ctx := context.Background()
	plain, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: imp.ID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = r.client.StopRestore(ctx, plain.ID) })
	cases := []struct {
		name, id, body, fragment string
		status                   int
	}{
		{"unknown restore", "no-such-restore", `{}`, "no-such-restore", http.StatusNotFound},
		{"not pausable", plain.ID, `{}`, "pausable", http.StatusConflict},
		{"then misspelt", in.ID, `{"then":"later"}`, "then", http.StatusBadRequest},
		{"unknown field", in.ID, `{"alais":"x"}`, "alais", http.StatusBadRequest},
		{"alias malformed", in.ID, `{"alias":"a b"}`, "alias", http.StatusBadRequest},
		{"alias read as a flag", in.ID, `{"alias":"-x"}`, "must not start with '-'", http.StatusBadRequest},
		{"alias an id", in.ID, `{"alias":"` + imp.ID + `"}`, "snapshot id", http.StatusBadRequest},
		{"alias taken", in.ID, `{"alias":"base"}`, "base", http.StatusConflict},
		{"not an object", in.ID, `[]`, "object", http.StatusBadRequest},
		{"two objects", in.ID, `{}{}`, "more than one", http.StatusBadRequest},
		{"huge body", in.ID, `{"alias":"` + strings.Repeat("a", 2<<20) + `"}`, "larger", http.StatusRequestEntityTooLarge},
	}
	for _, c := range cases {
		status, text := rawPause(t, r, c.id, c.body)
		if status != c.status || !strings.Contains(text, c.fragment) {
			t.Errorf("%s: HTTP %d %s; want %d saying %q", c.name, status, text, c.status, c.fragment)
		}
	}
	res, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
	if err != nil {
		t.Fatal(err)
	}
	if res.Parent != imp.ID || res.Alias != "kid" || res.Depth != 1 {
		t.Fatalf("pause after the bad ones: %+v", res)
	}
	childReadsStamped(t, r, f, "kid")
}

// TestDeleteParentDuringAPause: the parent deleted while a pause of a
// restore of it is between freeze and publish: either the delete is
// refused or the pause fails, as the client's conflict (409), as does
// every later pause; never a published child whose parent is gone.
func TestDeleteParentDuringAPause(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	held, r, imp, in := heldPausableRestore(t, f, nil)
	ctx := context.Background()
	paused := goPause(r, in.ID, api.PauseRequest{Alias: "kid"})
	<-held.reached
	_, delErr := r.client.DeleteSnapshot(ctx, imp.ID)
	held.let()
	p := <-paused
	if delErr == nil && p.err == nil {
		t.Fatalf("the parent was deleted and the pause published %+v over it", p.res)
	}
	if p.err == nil {
		childReadsStamped(t, r, f, "kid")
		return
	}
	// The parent is gone: the client's conflict, not the daemon's failure.
	wantStatus(t, "a pause whose parent was deleted", p.err, imp.ID, http.StatusConflict)
	_, err := r.client.Pause(ctx, in.ID, api.PauseRequest{})
	wantStatus(t, "a later pause of it", err, imp.ID, http.StatusConflict)
}

// TestFlattenParentDuringAPause: a child C restored pausable is
// flattened (full) while a pause of that restore is between freeze and
// publish. The pause read C's record (with C's own diff layer) before;
// the flatten retires that layer. Either the flatten is refused, or the
// pause fails, or its child restores with the right memory and verifies:
// never a child naming a layer that is gone.
func TestFlattenParentDuringAPause(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	held, r, _, in := heldPausableRestore(t, f, nil)
	ctx := context.Background()
	first := goPause(r, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
	<-held.reached
	held.let()
	if p := <-first; p.err != nil {
		t.Fatal(p.err)
	}
	// The hook holds only the first pause; hold the next with a fresh one.
	again := holdPause(t, pause.StepPublish)
	t.Cleanup(again.let)
	kid, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "kid", Pausable: true})
	if err != nil {
		t.Fatal(err)
	}
	paused := goPause(r, kid.ID, api.PauseRequest{Alias: "grandkid", Then: api.ThenStop})
	<-again.reached
	repo, err := posixfs.Open(f.cfg.Backend.PosixFS.SnapshotStore, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, flatErr := ops.Flatten(ctx, repo, "kid", ops.FlattenOptions{Full: true, StagingDir: t.TempDir()})
	again.let()
	p := <-paused
	if flatErr != nil && p.err != nil {
		t.Fatalf("both the flatten (%v) and the pause (%v) failed", flatErr, p.err)
	}
	if p.err != nil {
		// The parent changed under the pause: the client's conflict, and a
		// pause again builds over the flattened parent.
		wantStatus(t, "a pause whose parent was flattened meanwhile", p.err, "no longer holds", http.StatusConflict)
		if _, err := r.client.Pause(ctx, kid.ID, api.PauseRequest{Alias: "grandkid", Then: api.ThenStop}); err != nil {
			t.Fatalf("a pause after the flatten: %v", err)
		}
	}
	if rep, err := r.client.VerifySnapshot(ctx, "grandkid", api.VerifyRequest{}); err != nil {
		t.Fatalf("verify of the child published over a flattened parent: %+v, %v", rep, err)
	}
	childReadsStamped(t, r, f, "grandkid")
}

// TestPauseChainAttacks: two restores of one snapshot paused at once
// each publish a whole child; a child of a child restored from the first;
// the middle child's delete is refused while the grandchild needs it;
// verify passes on the whole chain, and reports a flipped byte in the
// middle child's layer when verifying the grandchild, whose restore then
// fails rather than serve the wrong page; failed and finished pauses
// leave nothing in the staging directory.
func TestPauseChainAttacks(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r, vm, imp := stampingDaemon(t, f, nil)
	ctx := context.Background()
	var ins [2]api.RestoreInfo
	for i := range ins {
		var err error
		if ins[i], err = r.client.Restore(ctx, api.RestoreRequest{Snapshot: imp.ID, Pausable: true}); err != nil {
			t.Fatal(err)
		}
	}
	vm.stamp.Store(0) // restores of the children only read
	a, b := goPause(r, ins[0].ID, api.PauseRequest{Alias: "a"}), goPause(r, ins[1].ID, api.PauseRequest{Alias: "b", Then: api.ThenStop})
	pa, pb := <-a, <-b
	if pa.err != nil || pb.err != nil {
		t.Fatalf("concurrent pauses of two restores of one snapshot: %v; %v", pa.err, pb.err)
	}
	childReadsStamped(t, r, f, "a")
	childReadsStamped(t, r, f, "b")

	kid, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "a", Pausable: true})
	if err != nil {
		t.Fatal(err)
	}
	g, err := r.client.Pause(ctx, kid.ID, api.PauseRequest{Alias: "g", Then: api.ThenStop})
	if err != nil {
		t.Fatal(err)
	}
	if g.Parent != pa.res.Snapshot {
		t.Fatalf("grandchild %+v; want a child of %s", g, pa.res.Snapshot)
	}
	childReadsStamped(t, r, f, "g")
	_, err = r.client.DeleteSnapshot(ctx, "a")
	wantStatus(t, "delete of the middle child", err, "", http.StatusConflict)
	for _, id := range []string{imp.ID, "a", "b", "g"} {
		if rep, err := r.client.VerifySnapshot(ctx, id, api.VerifyRequest{}); err != nil || !rep.OK {
			t.Fatalf("verify %s: %+v, %v", id, rep, err)
		}
	}
	if _, err := r.client.StopRestore(ctx, ins[0].ID); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(f.cfg.Runtime.Dir, "pause-*")); len(left) != 0 {
		t.Fatalf("staging left after the pauses: %v", left)
	}

	flipLayerByte(t, f.cfg.Backend.PosixFS.SnapshotStore, pa.res.Snapshot)
	if rep, err := r.client.VerifySnapshot(ctx, "g", api.VerifyRequest{}); err == nil && rep.OK {
		t.Fatalf("verify of a grandchild whose middle layer has a flipped byte: %+v", rep)
	}
	bad, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "g"})
	if err == nil {
		_, _ = r.client.StopRestore(ctx, bad.ID)
		t.Fatalf("a restore over a flipped byte in its chain became ready: %+v", bad.Ready)
	}
}

// flipLayerByte flips the first byte of id's own diff layer data.
func flipLayerByte(t *testing.T, store, id string) {
	t.Helper()
	var found []string
	err := filepath.WalkDir(store, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Base(filepath.Dir(path)) == id &&
			strings.HasPrefix(d.Name(), "layer-") && strings.HasSuffix(d.Name(), ".bin") {
			found = append(found, path)
		}
		return err
	})
	if err != nil || len(found) != 1 {
		t.Fatalf("layer data of %s: %v, %v", id, found, err)
	}
	fh, err := os.OpenFile(found[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	var one [1]byte
	if _, err := fh.ReadAt(one[:], 0); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0xff
	if _, err := fh.WriteAt(one[:], 0); err != nil {
		t.Fatal(err)
	}
}

// TestPauseWithStagingFull: the pause's staging directory is full (a
// tiny tmpfs mounted over it) when the VMM saves the changed pages. The
// pause fails, the sandbox runs on, and a pause once space is back
// publishes a child holding every page the guest wrote.
func TestPauseWithStagingFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	f := newFixture(t, fixtureOptions{})
	var mounted []string
	t.Cleanup(func() {
		for _, m := range mounted {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", m, err)
			}
		}
	})
	onFirstPauseAt(t, pause.StepPause, func() {
		dir := pauseStaging(t, f)
		if dir == "" {
			return
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=8k"); err != nil {
			t.Errorf("mount a tiny tmpfs: %v", err)
			return
		}
		mounted = append(mounted, dir)
	})
	r, imp, in := pausableRestore(t, f, nil)
	ctx := context.Background()
	_, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid"})
	if err == nil {
		t.Fatal("a pause into a full staging directory published")
	}
	info, err := r.client.Restores(ctx)
	if err != nil || len(info) != 1 || info[0].Exit != nil {
		t.Fatalf("restores after the failed pause: %+v, %v; want the sandbox running", info, err)
	}
	res, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
	if err != nil {
		t.Fatalf("a pause once space is back: %v", err)
	}
	if res.Parent != imp.ID {
		t.Fatalf("pause: %+v", res)
	}
	childReadsStamped(t, r, f, "kid")
}

// TestPauseWithStagingRemoved: the pause's staging directory is removed
// after the VMM saved the changed pages into it (and forgot them). The
// pause fails; its pages are gone, so a later pause must be refused
// rather than publish a child without them.
func TestPauseWithStagingRemoved(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	onFirstPauseAt(t, pause.StepLayer, func() {
		if dir := pauseStaging(t, f); dir != "" {
			if err := os.RemoveAll(dir); err != nil {
				t.Error(err)
			}
		}
	})
	r, _, in := pausableRestore(t, f, nil)
	ctx := context.Background()
	if _, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid"}); err == nil {
		t.Fatal("a pause whose staging was removed published")
	}
	res, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
	if err == nil {
		t.Logf("pause after the staging was removed: %+v", res)
		childReadsStamped(t, r, f, "kid")
		return
	}
	wantStatus(t, "a pause after the pages were lost", err, "lost", http.StatusConflict)
}

// TestPauseAtMaxDepthOneOverAFlattenedChain: with [pause] max_depth = 1
// every pause of a child merges into one layer over the base; a child
// flattened whole (a plain memory with a parent) is paused again, and
// the next pauses build over it. Every child's memory is compared page by
// page with the chain's, every child verifies.
func TestPauseAtMaxDepthOneOverAFlattenedChain(t *testing.T) {
	c := newPauseChain(t, 1)
	f, vm, mem, imp := c.f, c.vm, c.mem, c.base
	ctx := context.Background()
	repo, err := posixfs.Open(f.cfg.Backend.PosixFS.SnapshotStore, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids, mems := []string{imp.ID}, [][]byte{bytes.Clone(mem)}
	want := map[int]struct {
		depth int
		flat  bool
	}{1: {1, false}, 2: {1, true}, 3: {1, false}, 4: {1, true}}
	for k := 1; k <= 4; k++ {
		g := c.pauseGeneration(t, ids[k-1], mems[k-1], k, uint64(0x2000+k))
		res := g.res
		if w := want[k]; res.Parent != ids[k-1] || res.Depth != w.depth || res.Flattened != w.flat {
			t.Fatalf("pause %d: %+v; want a child of %s at depth %d (flattened %t)", k, res, ids[k-1], w.depth, w.flat)
		}
		ids, mems = append(ids, res.Snapshot), append(mems, g.mem)
		if k == 2 {
			// Flatten the second child whole: the third pause is of a
			// restore of a plain memory that has a parent.
			if _, err := ops.Flatten(ctx, repo, res.Snapshot, ops.FlattenOptions{Full: true, StagingDir: t.TempDir()}); err != nil {
				t.Fatal(err)
			}
			want[3] = struct {
				depth int
				flat  bool
			}{1, false}
			want[4] = struct {
				depth int
				flat  bool
			}{1, true}
		}
	}
	vm.set(f.ref.Trace, 0)
	for k := 1; k <= 4; k++ {
		samePagesAnyFormat(t, repo, ids[k], mems[k])
		if rep, err := snapcheck.Verify(ctx, repo, ids[k], snapcheck.Options{}); err != nil || !rep.OK {
			t.Fatalf("verify child %d: %+v, %v", k, rep, err)
		}
	}
}

// samePagesAnyFormat is samePages also for a plain memory file (a child
// flattened whole).
func samePagesAnyFormat(t *testing.T, repo repository.Repository, id string, want []byte) {
	t.Helper()
	res, err := repo.Resolve(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if res.Memory != nil {
		samePages(t, repo, id, want)
		return
	}
	got, err := os.ReadFile(res.MemoryPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("snapshot %s: its memory file differs from the chain's memory with the new pages", id)
	}
}

// TestVMMKilledDuringAPause: the VMM is killed (SIGKILL) at a step of a
// pause. Killed before the freeze, the pause fails and publishes nothing;
// killed once its state is saved, with then=stop, the child is published
// whole and the answer says so (the stop of a VM already gone is not the
// pause's failure). Either way the restore stops cleanly and no staging
// is left.
func TestVMMKilledDuringAPause(t *testing.T) {
	for _, step := range []string{pause.StepPause, pause.StepPublish} {
		t.Run(step, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{})
			var pid atomic.Int64
			onFirstPauseAt(t, step, func() {
				p, err := os.FindProcess(int(pid.Load()))
				if err == nil {
					err = p.Signal(syscall.SIGKILL)
				}
				if err != nil {
					t.Errorf("kill the VMM: %v", err)
				}
			})
			r, _, in := pausableRestore(t, f, nil)
			pid.Store(int64(in.Ready.PID))
			ctx := context.Background()
			res, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
			switch step {
			case pause.StepPause:
				if err == nil {
					t.Fatalf("a pause whose VMM was killed before the freeze published %+v", res)
				}
				if _, err := r.client.Snapshot(ctx, "kid"); err == nil {
					t.Fatal("a failed pause left a child")
				}
				if _, err := r.client.StopRestore(ctx, in.ID); err != nil {
					t.Fatalf("stop after the failed pause: %v", err)
				}
			default:
				if err != nil {
					if _, gerr := r.client.Snapshot(ctx, "kid"); gerr == nil {
						t.Fatalf("the pause answered %v, but its child was published", err)
					}
					t.Fatalf("pause with the VMM killed after the freeze: %v", err)
				}
				childReadsStamped(t, r, f, "kid")
			}
			if left, _ := filepath.Glob(filepath.Join(f.cfg.Runtime.Dir, "pause-*")); len(left) != 0 {
				t.Fatalf("staging left: %v", left)
			}
			if list, err := r.client.Restores(ctx); err != nil || len(list) != 0 {
				t.Fatalf("restores left: %+v, %v", list, err)
			}
		})
	}
}

// TestManifestRecordedOnTheParentDuringAPause: the parent's startup
// manifest is recorded and attached (its record rewritten) while a pause
// of a restore of it is between freeze and publish: the child is
// published over the parent's layers, which did not change, restores
// with the guest's memory, and both verify.
func TestManifestRecordedOnTheParentDuringAPause(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	held, r, imp, in := heldPausableRestore(t, f, nil)
	ctx := context.Background()
	paused := goPause(r, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
	<-held.reached
	if _, err := r.client.RecordManifest(ctx, imp.ID); err != nil {
		t.Fatalf("record the parent's manifest during a pause: %v", err)
	}
	held.let()
	if p := <-paused; p.err != nil {
		t.Fatalf("the pause: %v", p.err)
	}
	childReadsStamped(t, r, f, "kid")
	for _, id := range []string{imp.ID, "kid"} {
		if rep, err := r.client.VerifySnapshot(ctx, id, api.VerifyRequest{}); err != nil || !rep.OK {
			t.Fatalf("verify %s: %+v, %v", id, rep, err)
		}
	}
	info, err := r.client.Snapshot(ctx, imp.ID)
	if err != nil || info.Manifest == nil {
		t.Fatalf("the parent after the recording: %+v, %v; want a manifest", info, err)
	}
}

// TestPauseClientGoesAway: the client of a then=stop pause goes away
// while the pause is between freeze and publish. The pause still
// publishes its child whole and stops the VM (no paused VM is left), and
// the child's first restore prefetches its harvested manifest.
func TestPauseClientGoesAway(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	held, r, _, in := heldPausableRestore(t, f, nil)
	stopped := r.log.logged("restore stopped")
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan error, 1)
	go func() {
		_, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
		out <- err
	}()
	<-held.reached
	cancel()
	if err := <-out; err == nil {
		t.Fatal("a pause whose client went away answered")
	}
	held.let()
	<-stopped
	bg := context.Background()
	if list, err := r.client.Restores(bg); err != nil || len(list) != 0 {
		t.Fatalf("restores after the abandoned pause: %+v, %v; want it stopped", list, err)
	}
	child, err := r.client.Restore(bg, api.RestoreRequest{Snapshot: "kid"})
	if err != nil {
		t.Fatalf("restore of the child of the abandoned pause: %v", err)
	}
	if _, err := r.client.StopRestore(bg, child.ID); err != nil {
		t.Fatal(err)
	}
	if p := child.Prefetch; p.State == "skipped" || p.PlannedBytes == 0 || p.Manifest == "" {
		t.Fatalf("the child's first restore prefetched %+v; want its harvested manifest", p)
	}
	childReadsStamped(t, r, f, "kid")
}

// TestPauseOfAnExitedRestore: a pause of a restore whose VM has exited
// is the client's conflict (409, saying it exited), publishes nothing,
// and the restore still stops cleanly.
func TestPauseOfAnExitedRestore(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r, _, in := pausableRestore(t, f, nil)
	ctx := context.Background()
	if err := syscall.Kill(in.Ready.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitListedExited(t, r.client, in.ID)
	_, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid"})
	wantStatus(t, "a pause of an exited restore", err, "exited", http.StatusConflict)
	if _, err := r.client.Snapshot(ctx, "kid"); err == nil {
		t.Fatal("a pause of an exited restore published a child")
	}
	if _, err := r.client.StopRestore(ctx, in.ID); err != nil {
		t.Fatalf("stop of the exited restore: %v", err)
	}
}

// TestDaemonStartSweepsPauseStaging: a daemon that died during a pause
// left its staging directory (the VM state and every changed page) in
// the runtime directory; the next daemon on it (it holds the runtime
// directory's lock, so no pause of another runs there) removes it.
func TestDaemonStartSweepsPauseStaging(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	left := filepath.Join(f.cfg.Runtime.Dir, "pause-01a250f0-9e35-70d7-b7ad-1463d66eea22-1507134433")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "memory.diff"), []byte("pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, f, nil)
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a dead daemon's pause staging is still there (stat: %v)", err)
	}
}

// TestTwoPausesForOneAlias: two restores of one snapshot paused at once
// under the same alias: one child gets it, the other pause is a 409
// naming the alias and keeps its pages, so its pause under another alias
// holds every page its guest wrote.
func TestTwoPausesForOneAlias(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r, vm, imp := stampingDaemon(t, f, nil)
	ctx := context.Background()
	var ids [2]string
	for i := range ids {
		in, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: imp.ID, Pausable: true})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = in.ID
	}
	vm.stamp.Store(0)
	a, b := goPause(r, ids[0], api.PauseRequest{Alias: "same"}), goPause(r, ids[1], api.PauseRequest{Alias: "same"})
	pa, pb := <-a, <-b
	loser := ids[1]
	switch {
	case pa.err == nil && pb.err != nil:
		wantStatus(t, "the second pause for a taken alias", pb.err, "same", http.StatusConflict)
	case pb.err == nil && pa.err != nil:
		wantStatus(t, "the first pause for a taken alias", pa.err, "same", http.StatusConflict)
		loser = ids[0]
	default:
		t.Fatalf("two pauses for one alias: %+v, %v; %+v, %v; want one child", pa.res, pa.err, pb.res, pb.err)
	}
	if _, err := r.client.Pause(ctx, loser, api.PauseRequest{Alias: "other", Then: api.ThenStop}); err != nil {
		t.Fatal(err)
	}
	childReadsStamped(t, r, f, "same")
	childReadsStamped(t, r, f, "other")
}

// TestManyPausesOfOneRestore: a restore paused six times with then=resume
// (its guest wrote only before the first): each pause is a child of the
// last, the later ones with nothing changed take their parent's layers
// (the chain does not grow), and every child restores with the guest's
// memory and verifies, also once a middle child owning no layer is
// deleted (the child owning the layer cannot be).
func TestManyPausesOfOneRestore(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r, imp, in := pausableRestore(t, f, nil)
	ctx := context.Background()
	parent := imp.ID
	var children []string
	for i := range 6 {
		res, err := r.client.Pause(ctx, in.ID, api.PauseRequest{})
		if err != nil {
			t.Fatalf("pause %d: %v", i, err)
		}
		if res.Parent != parent || res.Depth != 1 || (i > 0) != (res.Pages.Candidates == 0) {
			t.Fatalf("pause %d: %+v; want a child of %s at depth 1, changed pages only in the first", i, res, parent)
		}
		parent = res.Snapshot
		children = append(children, res.Snapshot)
	}
	if _, err := r.client.StopRestore(ctx, in.ID); err != nil {
		t.Fatal(err)
	}
	// A middle child owning no layer holds nothing its children read: its
	// delete is allowed, and they still restore.
	if _, err := r.client.DeleteSnapshot(ctx, children[2]); err != nil {
		t.Fatalf("delete of a middle child owning no layer: %v", err)
	}
	_, err := r.client.DeleteSnapshot(ctx, children[0])
	wantStatus(t, "delete of the child owning the layer", err, "", http.StatusConflict)
	children = slices.Delete(children, 2, 3)
	for _, id := range children {
		childReadsStamped(t, r, f, id)
		if rep, err := r.client.VerifySnapshot(ctx, id, api.VerifyRequest{}); err != nil || !rep.OK {
			t.Fatalf("verify %s: %+v, %v", id, rep, err)
		}
	}
}

// TestParentQuarantinedDuringAPause: the parent's record is damaged and
// a sweep (another process opening the store) moves it to the quarantine
// while a pause of a restore of it is between freeze and publish. The
// pause fails and publishes nothing: no child over a parent whose record
// cannot be read.
func TestParentQuarantinedDuringAPause(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	held, r, imp, in := heldPausableRestore(t, f, nil)
	ctx := context.Background()
	paused := goPause(r, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
	<-held.reached
	store := f.cfg.Backend.PosixFS.SnapshotStore
	record := filepath.Join(store, "catalog", "records", imp.ID+".json")
	if err := os.WriteFile(record, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := posixfs.Open(store, posixfs.Options{}); err != nil {
		t.Fatal(err)
	}
	held.let()
	p := <-paused
	if p.err == nil {
		t.Fatalf("a pause over a quarantined parent published %+v", p.res)
	}
	if _, err := r.client.Snapshot(ctx, "kid"); err == nil {
		t.Fatal("the failed pause left a child")
	}
}
