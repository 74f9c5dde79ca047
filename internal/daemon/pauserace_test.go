package daemon_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/snapcheck"
	"warmstart/internal/vmm/replay"
)

// heldPause holds the first pause that reaches step until released (or
// until the pause's context ends).
type heldPause struct {
	step    string
	reached chan struct{}
	release chan struct{}
	first   sync.Once
	free    sync.Once
}

// holdPause installs the hook; call it before the daemon starts.
func holdPause(t *testing.T, step string) *heldPause {
	h := &heldPause{step: step, reached: make(chan struct{}), release: make(chan struct{})}
	daemon.SetPauseStepHook(t, h.hook)
	return h
}

func (h *heldPause) hook(ctx context.Context, _, step string) {
	if step != h.step {
		return
	}
	held := false
	h.first.Do(func() { held = true; close(h.reached) })
	if !held {
		return
	}
	select {
	case <-h.release:
	case <-ctx.Done():
	}
}

// let releases the held pause; cleanup-safe.
func (h *heldPause) let() { h.free.Do(func() { close(h.release) }) }

type pauseOutcome struct {
	res api.PauseResult
	err error
}

type stopOutcome struct {
	res api.StopResponse
	err error
}

// pausableRestore imports the reference snapshot and restores it
// pausable on a daemon whose replay VMM stamps the pages it writes.
func pausableRestore(t *testing.T, f *fixture, tweak func(*daemon.Options)) (*running, api.ImportResponse, api.RestoreInfo) {
	t.Helper()
	r, vm, imp := stampingDaemon(t, f, tweak)
	in, err := r.client.Restore(context.Background(), api.RestoreRequest{Snapshot: imp.ID, Pausable: true})
	if err != nil {
		t.Fatal(err)
	}
	vm.stamp.Store(0) // restores of the children only read
	return r, imp, in
}

func goPause(r *running, id string, req api.PauseRequest) <-chan pauseOutcome {
	out := make(chan pauseOutcome, 1)
	go func() {
		res, err := r.client.Pause(context.Background(), id, req)
		out <- pauseOutcome{res, err}
	}()
	return out
}

// wantStatus checks that err is an API error with one of the statuses and
// a message containing fragment.
func wantStatus(t *testing.T, what string, err error, fragment string, statuses ...int) {
	t.Helper()
	var ae *api.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("%s: %v, want HTTP %v", what, err, statuses)
	}
	for _, s := range statuses {
		if ae.StatusCode == s && strings.Contains(ae.Message, fragment) {
			return
		}
	}
	t.Fatalf("%s: %v, want HTTP %v saying %q", what, err, statuses, fragment)
}

// childReadsStamped restores id and checks that its guest reads the
// reference memory with the pages the first restore wrote stamped.
func childReadsStamped(t *testing.T, r *running, f *fixture, id string) {
	t.Helper()
	entries, written := tracedWrites(t, f.ref.Trace)
	want, err := replay.ExpectedHash(stampedMemory(t, f.ref.Memory, written, 0x5eed), entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	restoreReadsHash(t, r, id, want)
}

// TestStopWaitsForAPauseInProgress: a stop arriving while a pause is
// between freeze and publish waits for it; a pause arriving once that
// stop has begun is refused, naming the restore; the held pause then
// publishes a whole child and the stop stops the VM it left paused.
func TestStopWaitsForAPauseInProgress(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	held, r, _, in := heldPausableRestore(t, f, nil)
	ctx := context.Background()

	paused := goPause(r, in.ID, api.PauseRequest{Then: api.ThenStop})
	<-held.reached
	waiting := r.log.logged(daemon.MsgStopWaitsForPause)
	stopped := make(chan stopOutcome, 1)
	go func() {
		res, err := r.client.StopRestore(ctx, in.ID)
		stopped <- stopOutcome{res, err}
	}()
	select {
	case <-waiting:
	case s := <-stopped:
		t.Fatalf("the stop ended (%+v, %v) while a pause was between freeze and publish", s.res, s.err)
	case p := <-paused:
		t.Fatalf("the held pause ended: %+v, %v", p.res, p.err)
	}
	_, err := r.client.Pause(ctx, in.ID, api.PauseRequest{})
	wantStatus(t, "a pause after the stop began", err, in.ID, 404, 409)

	held.let()
	p := <-paused
	if p.err != nil {
		t.Fatalf("the held pause: %v", p.err)
	}
	s := <-stopped
	if s.err != nil {
		t.Fatalf("the stop that waited: %v", s.err)
	}
	if p.res.Depth != 1 || p.res.Pages.Stored == 0 {
		t.Fatalf("held pause: %+v; want a child at depth 1 storing the written pages", p.res)
	}
	if list, err := r.client.Restores(ctx); err != nil || len(list) != 0 {
		t.Fatalf("restores after the stop: %+v, %v; want none", list, err)
	}
	childReadsStamped(t, r, f, p.res.Snapshot)
}

// TestSecondPauseWhileOneRunsIsRefused: with then=resume the VM runs
// again before the child is published; a second pause then must not
// freeze it (its child would be of the old parent and miss the first
// pause's pages): it is refused with 409, and a pause after the first
// is a child of its child.
func TestSecondPauseWhileOneRunsIsRefused(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	held, r, _, in := heldPausableRestore(t, f, nil)
	ctx := context.Background()

	paused := goPause(r, in.ID, api.PauseRequest{})
	<-held.reached
	second, err := r.client.Pause(ctx, in.ID, api.PauseRequest{})
	if err == nil {
		t.Fatalf("a second pause while one runs published %+v", second)
	}
	wantStatus(t, "a second pause while one runs", err, "already in progress", 409)
	held.let()
	first := <-paused
	if first.err != nil {
		t.Fatalf("the first pause: %v", first.err)
	}
	after, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Then: api.ThenStop})
	if err != nil {
		t.Fatal(err)
	}
	if after.Parent != first.res.Snapshot || after.Stop == nil {
		t.Fatalf("pause after the first: %+v; want a child of %s, stopped", after, first.res.Snapshot)
	}
	childReadsStamped(t, r, f, after.Snapshot)
}

// TestShutdownDuringAPause: a daemon shut down while a pause (then=stop,
// the VM paused) is between freeze and publish waits for it through the
// shutdown grace, then ends it: the pause either published a whole child
// or failed leaving nothing, the VM is stopped, and the shutdown
// completes without error.
func TestShutdownDuringAPause(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	held, r, imp, in := heldPausableRestore(t, f, func(o *daemon.Options) { o.ShutdownGrace = 200 * time.Millisecond })

	paused := goPause(r, in.ID, api.PauseRequest{Then: api.ThenStop})
	<-held.reached
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.d.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown during a pause: %v", err)
	}
	p := <-paused
	repo, err := posixfs.Open(f.cfg.Backend.PosixFS.SnapshotStore, posixfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := repo.List(context.Background(), repository.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case p.err == nil:
		t.Logf("the pause published %s before the shutdown ended it", p.res.Snapshot)
		if len(recs) != 2 {
			t.Fatalf("store holds %d snapshots, want the base and the child", len(recs))
		}
		if rep, err := snapcheck.Verify(context.Background(), repo, p.res.Snapshot, snapcheck.Options{}); err != nil || !rep.OK {
			t.Fatalf("verify the child: %+v, %v", rep, err)
		}
	default:
		t.Logf("the pause failed: %v", p.err)
		if len(recs) != 1 || recs[0].ID != imp.ID {
			t.Fatalf("a failed pause left %d snapshots, want the base alone: %+v", len(recs), recs)
		}
	}
	left, err := filepath.Glob(filepath.Join(f.cfg.Runtime.Dir, "pause-*"))
	if err != nil || len(left) != 0 {
		t.Fatalf("pause staging left behind: %v, %v", left, err)
	}
	if ents, err := os.ReadDir(filepath.Join(f.cfg.Runtime.Dir, "restores")); err == nil && len(ents) != 0 {
		t.Fatalf("restore directories left after shutdown: %d", len(ents))
	}
}

// TestStopCancelsAPauseThatDoesNotEnd: a pause held past the stop
// timeout is cancelled by the stop that waits for it: it answers 409
// naming the stop, publishes nothing, and the stop then stops the VM.
func TestStopCancelsAPauseThatDoesNotEnd(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	held, r, imp, in := heldPausableRestore(t, f, func(o *daemon.Options) { o.StopTimeout = 300 * time.Millisecond })
	ctx := context.Background()

	paused := goPause(r, in.ID, api.PauseRequest{Then: api.ThenStop})
	<-held.reached
	stop, err := r.client.StopRestore(ctx, in.ID)
	if err != nil {
		t.Fatalf("stop of a restore whose pause does not end: %v", err)
	}
	p := <-paused
	wantStatus(t, "a pause the stop cancelled", p.err, "being stopped", 409)
	if r.log.attrsOf(daemon.MsgStopWaitsForPause) == nil {
		t.Fatalf("the stop (%+v) did not wait for the pause", stop)
	}
	snaps, err := r.client.Snapshots(ctx, repository.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 1 || snaps[0].ID != imp.ID {
		t.Fatalf("a cancelled pause left snapshots %+v; want the base alone", snaps)
	}
	if list, err := r.client.Restores(ctx); err != nil || len(list) != 0 {
		t.Fatalf("restores after the stop: %+v, %v; want none", list, err)
	}
}
