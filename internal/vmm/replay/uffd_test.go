package replay

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/trace"
	"warmstart/internal/vmm"
)

// guardTimeout fails a test that would otherwise hang; it paces nothing.
const guardTimeout = 30 * time.Second

// openLower opens the memory file at path as the uffd device does.
func openLower(t *testing.T, path string) memdev.Lower {
	t.Helper()
	l, err := memdev.File(path).Open()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// serveUffd starts a handler for mem, restores a replay VMM against it and
// accepts its session.
func serveUffd(t *testing.T, v *VMM, mem string, l layout.Layout) (*VM, *uffd.Session) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "uffd.sock")
	h, err := uffd.Listen(sock, openLower(t, mem), uffd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), guardTimeout)
	defer cancel()
	inst := start(t, t.Context(), v, vmm.RestoreSpec{SnapshotID: "test", Backend: vmm.BackendUffd, MemPath: sock, Layout: l})
	s, err := h.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return inst, s
}

func TestUffdModeMatchesMemoryFile(t *testing.T) {
	p := reference(t, 9)
	entries, err := trace.ReadFile(p.Trace)
	if err != nil {
		t.Fatal(err)
	}
	// One range the trace touched, one it did not.
	remove := []Range{{Offset: entries[0].Offset, Length: trace.PageBytes}, {Offset: testMemoryBytes - 64<<10, Length: 64 << 10}}
	want, err := ExpectedHash(p.Memory, entries, remove)
	if err != nil {
		t.Fatal(err)
	}
	l := layout.Single(testMemoryBytes)
	inst, s := serveUffd(t, &VMM{TracePath: p.Trace, Remove: remove}, p.Memory, l)

	ms := s.Mappings()
	if len(ms) != 1 || ms[0].Size != testMemoryBytes || ms[0].Offset != 0 || ms[0].PageSize != trace.PageBytes ||
		ms[0].BaseHostVirtAddr == 0 || ms[0].BaseHostVirtAddr%trace.PageBytes != 0 {
		t.Fatalf("handshake mappings %+v, want one page-aligned region of %d bytes at offset 0", ms, testMemoryBytes)
	}
	ctx, cancel := context.WithTimeout(t.Context(), guardTimeout)
	defer cancel()
	info, err := inst.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Detail["sha256"] != want {
		t.Fatalf("replay vmm hash %s, memory file hash %s", info.Detail["sha256"], want)
	}
	if r, _ := inst.Report(); r.RemovedPages != 17 {
		t.Fatalf("%d pages touched after removal, want 17", r.RemovedPages)
	}
	if st := s.Stats(); st.Removes != uint64(len(remove)) || st.ZeroPages != 17 {
		t.Errorf("handler stats %+v, want %d remove events and 17 zero pages", st, len(remove))
	}
	inst.RequestStop()
	if err := inst.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	assertGone(t, inst.PID())
	select {
	case <-s.Done():
	case <-ctx.Done():
		t.Fatal("session still serving after the VMM exited")
	}
}

// TestUffdModeRegions checks the handshake of a layout with several
// regions: one mapping per region, at its file offset.
func TestUffdModeRegions(t *testing.T) {
	p := reference(t, 4)
	l, err := layout.Parse("0:4MiB,6MiB:2MiB,12MiB:4MiB", testMemoryBytes)
	if err != nil {
		t.Fatal(err)
	}
	var entries []trace.Entry
	for _, r := range l.Regions {
		for off := r.Offset; off < r.End(); off += 61 * trace.PageBytes {
			entries = append(entries, trace.Entry{Offset: off, Write: off%3 == 0})
		}
	}
	tracePath := filepath.Join(t.TempDir(), "trace")
	if err := trace.WriteFile(tracePath, entries); err != nil {
		t.Fatal(err)
	}
	want, err := ExpectedHash(p.Memory, entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	inst, s := serveUffd(t, &VMM{TracePath: tracePath}, p.Memory, l)
	ms := s.Mappings()
	if len(ms) != len(l.Regions) {
		t.Fatalf("%d mappings, want %d", len(ms), len(l.Regions))
	}
	for i, m := range ms {
		r := l.Regions[i]
		if m.Offset != uint64(r.Offset) || m.Size != uint64(r.Size) || m.PageSize != uint64(r.PageSize) {
			t.Errorf("mapping %d %+v, want region %+v", i, m, r)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), guardTimeout)
	defer cancel()
	info, err := inst.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Detail["sha256"] != want {
		t.Fatalf("hash %s, want %s", info.Detail["sha256"], want)
	}
	inst.RequestStop()
	if err := inst.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestUffdModeNoHandler(t *testing.T) {
	p := reference(t, 1)
	inst := start(t, t.Context(), &VMM{TracePath: p.Trace},
		vmm.RestoreSpec{Backend: vmm.BackendUffd, MemPath: filepath.Join(t.TempDir(), "absent.sock"), Layout: layout.Single(testMemoryBytes)})
	ctx, cancel := context.WithTimeout(t.Context(), guardTimeout)
	defer cancel()
	if _, err := inst.WaitReady(ctx); !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "connect to page-fault handler") {
		t.Fatalf("WaitReady without a handler: %v, want ErrExited", err)
	}
}

// TestPausedRestore checks that a paused VMM hands its memory over but
// touches nothing until Resume.
func TestPausedRestore(t *testing.T) {
	p := reference(t, 3)
	entries, err := trace.ReadFile(p.Trace)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ExpectedHash(p.Memory, entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "uffd.sock")
	h, err := uffd.Listen(sock, openLower(t, p.Memory), uffd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), guardTimeout)
	defer cancel()
	inst := start(t, ctx, &VMM{TracePath: p.Trace},
		vmm.RestoreSpec{Backend: vmm.BackendUffd, MemPath: sock, Layout: layout.Single(testMemoryBytes), Paused: true})
	s, err := h.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-inst.Paused():
	case <-ctx.Done():
		t.Fatal("no paused event")
	}
	if st := s.Stats(); st.Faults != 0 {
		t.Fatalf("%d faults before resume", st.Faults)
	}
	if _, ok := inst.Report(); ok {
		t.Fatal("ready before resume")
	}
	resumed := time.Now()
	if err := inst.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := inst.Resume(); err != nil {
		t.Fatalf("second Resume: %v", err)
	}
	info, err := inst.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Detail["sha256"] != want {
		t.Fatalf("hash %s, want %s", info.Detail["sha256"], want)
	}
	if r, _ := inst.Report(); r.FirstTouch.Before(resumed) {
		t.Fatalf("first touch at %v, before resume at %v", r.FirstTouch, resumed)
	}
	if st := s.Stats(); st.Faults == 0 {
		t.Fatal("no faults served after resume")
	}
	inst.RequestStop()
	if err := inst.Resume(); err == nil {
		t.Fatal("Resume after stop succeeded")
	}
	if err := inst.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStopWhilePaused(t *testing.T) {
	p := reference(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), guardTimeout)
	defer cancel()
	spec := fileSpec(p.Memory, layout.Single(testMemoryBytes))
	spec.Paused = true
	inst := start(t, ctx, &VMM{TracePath: p.Trace}, spec)
	select {
	case <-inst.Paused():
	case <-ctx.Done():
		t.Fatal("no paused event")
	}
	inst.RequestStop()
	if _, err := inst.WaitReady(ctx); !errors.Is(err, ErrExited) {
		t.Fatalf("WaitReady: %v, want ErrExited", err)
	}
	if err := inst.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	assertGone(t, inst.PID())
}

func TestResumeNotPaused(t *testing.T) {
	p := reference(t, 3)
	inst := start(t, t.Context(), &VMM{TracePath: p.Trace}, fileSpec(p.Memory, layout.Single(testMemoryBytes)))
	if err := inst.Resume(); err == nil {
		t.Fatal("Resume of an instance not restored paused succeeded")
	}
}

// TestReadyTimeout: a VMM that does not report ready within the driver's
// ReadyTimeout (here one paused and never resumed) fails WaitReady with
// ErrNotReady, as Firecracker's driver does after [envd] timeout, instead
// of leaving the restore waiting for ever.
func TestReadyTimeout(t *testing.T) {
	p := reference(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), guardTimeout)
	defer cancel()
	spec := fileSpec(p.Memory, layout.Single(testMemoryBytes))
	spec.Paused = true
	inst := start(t, ctx, &VMM{TracePath: p.Trace, ReadyTimeout: 200 * time.Millisecond}, spec)
	if _, err := inst.WaitReady(t.Context()); !errors.Is(err, ErrNotReady) {
		t.Fatalf("WaitReady: %v, want ErrNotReady", err)
	}
	inst.RequestStop()
	if err := inst.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	assertGone(t, inst.PID())
}
