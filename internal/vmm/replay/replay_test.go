package replay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	crand "crypto/rand"

	"warmstart/internal/lab/synth"
	"warmstart/internal/layout"
	"warmstart/internal/reexec"
	"warmstart/internal/trace"
	"warmstart/internal/vmm"
)

func TestMain(m *testing.M) {
	reexec.Roles{RoleReplayVMM: ChildMain}.Dispatch()
	// Under -race a process sleeps a second at exit to catch late reports;
	// children that exit on stop need not.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}

const testMemoryBytes = 16 << 20

// reference writes a small reference snapshot.
func reference(t *testing.T, seed uint64) synth.Paths {
	t.Helper()
	p, err := synth.Generate(context.Background(), synth.Options{MemoryBytes: testMemoryBytes, Seed: seed, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// start restores with v and makes sure the child is gone when the test ends.
func start(t *testing.T, ctx context.Context, v *VMM, spec vmm.RestoreSpec) *VM {
	t.Helper()
	if spec.RuntimeDir == "" {
		spec.RuntimeDir = t.TempDir()
	}
	inst, err := v.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		inst.Kill()
		<-inst.Exited()
	})
	return inst
}

// assertGone checks that the child process no longer exists.
func assertGone(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("replay vmm pid %d still exists (kill 0: %v)", pid, err)
	}
}

func fileSpec(mem string, l layout.Layout) vmm.RestoreSpec {
	return vmm.RestoreSpec{SnapshotID: "test", Backend: vmm.BackendFile, MemPath: mem, Layout: l}
}

func TestFileModeMatchesMemoryFile(t *testing.T) {
	p := reference(t, 5)
	entries, err := trace.ReadFile(p.Trace)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ExpectedHash(p.Memory, entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	inst := start(t, ctx, &VMM{TracePath: p.Trace}, fileSpec(p.Memory, layout.Single(testMemoryBytes)))
	info, err := inst.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Detail["sha256"]; got != want {
		t.Fatalf("replay vmm hash %s, memory file hash %s", got, want)
	}
	r, ok := inst.Report()
	stats := trace.Summarize(entries)
	if !ok || r.TouchedPages != stats.Pages || info.Detail["touched_pages"] == "" {
		t.Fatalf("report %+v (ok %v), want %d touched pages", r, ok, stats.Pages)
	}
	if !(r.Start.Before(r.FirstTouch) || r.Start.Equal(r.FirstTouch)) || r.Ready.Before(r.FirstTouch) {
		t.Fatalf("timings out of order: start %v, first touch %v, ready %v", r.Start, r.FirstTouch, r.Ready)
	}
	if info.Started != r.Start || info.Ready != r.Ready {
		t.Fatalf("ReadyInfo times %v..%v differ from the report %v..%v", info.Started, info.Ready, r.Start, r.Ready)
	}
	// The compute time of every touch after the first is spent between the
	// first touch and ready.
	if spent, min := r.Ready.Sub(r.FirstTouch), stats.Compute-entries[0].Compute; spent < min {
		t.Fatalf("trace played in %v, less than its compute time %v", spent, min)
	}
	if err := inst.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if err := inst.Wait(ctx); err != nil {
		t.Fatalf("wait after stop: %v", err)
	}
	assertGone(t, inst.PID())
	if _, err := os.Stat(inst.LogPath()); err != nil {
		t.Errorf("no log file: %v", err)
	}
}

// TestFileModeRandomTraces maps a layout of several regions with holes and
// plays random traces with repeats and writes.
func TestFileModeRandomTraces(t *testing.T) {
	dir := t.TempDir()
	mem := filepath.Join(dir, "memory.bin")
	content := make([]byte, 8<<20)
	crand.Read(content)
	if err := os.WriteFile(mem, content, 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := layout.Parse("0:2MiB,3MiB:1MiB,5MiB:3MiB", int64(len(content)))
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(3) {
		r := rand.New(rand.NewPCG(seed, 0))
		var entries []trace.Entry
		for range 500 {
			reg := l.Regions[r.IntN(len(l.Regions))]
			off := reg.Offset + r.Int64N(reg.Size/trace.PageBytes)*trace.PageBytes
			entries = append(entries, trace.Entry{Offset: off, Write: r.IntN(4) == 0, Compute: time.Duration(r.IntN(2000))})
		}
		tracePath := filepath.Join(dir, "trace")
		if err := trace.WriteFile(tracePath, entries); err != nil {
			t.Fatal(err)
		}
		want, err := ExpectedHash(mem, entries, nil)
		if err != nil {
			t.Fatal(err)
		}
		inst := start(t, t.Context(), &VMM{TracePath: tracePath}, fileSpec(mem, l))
		info, err := inst.WaitReady(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if info.Detail["sha256"] != want {
			t.Fatalf("seed %d: hash %s, want %s", seed, info.Detail["sha256"], want)
		}
		inst.RequestStop()
		if err := inst.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	// The writes went to private copies: the file is unchanged.
	after, err := os.ReadFile(mem)
	if err != nil || string(after) != string(content) {
		t.Fatalf("memory file changed under MAP_PRIVATE (err %v)", err)
	}
}

func TestExitBeforeReady(t *testing.T) {
	p := reference(t, 1)
	short := filepath.Join(t.TempDir(), "short.bin")
	if err := os.WriteFile(short, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "outside.trace")
	if err := trace.WriteFile(outside, []trace.Entry{{Offset: testMemoryBytes}}); err != nil {
		t.Fatal(err)
	}
	l := layout.Single(testMemoryBytes)
	for _, tc := range []struct {
		name, mem, trace, want string
	}{
		{"missing memory file", filepath.Join(t.TempDir(), "absent"), p.Trace, "open memory file"},
		{"missing trace", p.Memory, filepath.Join(t.TempDir(), "absent"), "open trace"},
		{"trace outside layout", p.Memory, outside, "outside the memory layout"},
		// Pages past the end of a file fault with SIGBUS.
		{"memory file too short", short, p.Trace, "memory fault"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst := start(t, t.Context(), &VMM{TracePath: tc.trace}, fileSpec(tc.mem, l))
			_, err := inst.WaitReady(t.Context())
			if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "exit status 1") {
				t.Fatalf("WaitReady: %v; want ErrExited, exit status 1 and %q", err, tc.want)
			}
			if err := inst.Wait(t.Context()); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Wait: %v, want an error with %q", err, tc.want)
			}
			assertGone(t, inst.PID())
		})
	}
}

// longTrace returns a trace whose second touch comes an hour after the first.
func longTrace(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "long.trace")
	if err := trace.WriteFile(path, []trace.Entry{{Offset: 0}, {Offset: 4096, Compute: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestStopBeforeReady(t *testing.T) {
	p := reference(t, 1)
	inst := start(t, t.Context(), &VMM{TracePath: longTrace(t)}, fileSpec(p.Memory, layout.Single(testMemoryBytes)))
	if err := inst.RequestStop(); err != nil {
		t.Fatal(err)
	}
	if _, err := inst.WaitReady(t.Context()); !errors.Is(err, ErrExited) {
		t.Fatalf("WaitReady after stop: %v, want ErrExited", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), guardTimeout)
	defer cancel()
	if err := inst.Wait(ctx); err != nil {
		t.Fatalf("a stop before ready is a clean exit: %v", err)
	}
	if err := inst.RequestStop(); err != nil {
		t.Fatalf("second RequestStop: %v", err)
	}
	assertGone(t, inst.PID())
}

func TestRestoreContextKills(t *testing.T) {
	p := reference(t, 1)
	ctx, cancel := context.WithCancel(t.Context())
	inst := start(t, ctx, &VMM{TracePath: longTrace(t)}, fileSpec(p.Memory, layout.Single(testMemoryBytes)))
	cancel()
	_, err := inst.WaitReady(t.Context())
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("WaitReady after cancel: %v, want ErrExited and killed", err)
	}
	if err := inst.Wait(t.Context()); err == nil {
		t.Fatal("Wait of a killed VMM returned nil")
	}
	assertGone(t, inst.PID())
}

func TestReadyOutlivesRestoreContext(t *testing.T) {
	p := reference(t, 2)
	ctx, cancel := context.WithCancel(t.Context())
	inst := start(t, ctx, &VMM{TracePath: p.Trace}, fileSpec(p.Memory, layout.Single(testMemoryBytes)))
	if _, err := inst.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	cancel()
	inst.RequestStop()
	if err := inst.Wait(t.Context()); err != nil {
		t.Fatalf("a ready VMM must outlive its restore context: %v", err)
	}
}

func TestWaitContextKills(t *testing.T) {
	p := reference(t, 1)
	inst := start(t, t.Context(), &VMM{TracePath: p.Trace}, fileSpec(p.Memory, layout.Single(testMemoryBytes)))
	if _, err := inst.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := inst.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with an ended context: %v, want context.Canceled", err)
	}
	assertGone(t, inst.PID())
}

func TestWaitReadyContext(t *testing.T) {
	p := reference(t, 1)
	inst := start(t, t.Context(), &VMM{TracePath: longTrace(t)}, fileSpec(p.Memory, layout.Single(testMemoryBytes)))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := inst.WaitReady(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReady: %v, want context.Canceled", err)
	}
	inst.RequestStop()
	guard, stop := context.WithTimeout(t.Context(), guardTimeout)
	defer stop()
	if err := inst.Wait(guard); err != nil {
		t.Fatal(err)
	}
}

func TestStartRejectsConfig(t *testing.T) {
	l := layout.Single(testMemoryBytes)
	huge := layout.Layout{FileSize: 4 << 20, Regions: []layout.Region{{Offset: 0, Size: 4 << 20, PageSize: 2 << 20}}}
	for name, tc := range map[string]struct {
		v    VMM
		spec vmm.RestoreSpec
	}{
		"no trace":        {VMM{}, fileSpec("/m", l)},
		"bad backend":     {VMM{TracePath: "/t"}, vmm.RestoreSpec{Backend: "Disk", MemPath: "/m", Layout: l}},
		"bad layout":      {VMM{TracePath: "/t"}, fileSpec("/m", layout.Layout{})},
		"remove on file":  {VMM{TracePath: "/t", Remove: []Range{{0, 4096}}}, fileSpec("/m", l)},
		"huge page file":  {VMM{TracePath: "/t"}, fileSpec("/m", huge)},
		"unaligned range": {VMM{TracePath: "/t", Remove: []Range{{1, 4096}}}, vmm.RestoreSpec{Backend: vmm.BackendUffd, MemPath: "/s", Layout: l}},
		"range outside":   {VMM{TracePath: "/t", Remove: []Range{{testMemoryBytes, 4096}}}, vmm.RestoreSpec{Backend: vmm.BackendUffd, MemPath: "/s", Layout: l}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := tc.v.Start(t.Context(), tc.spec); !errors.Is(err, ErrConfig) {
				t.Fatalf("Start: %v, want ErrConfig", err)
			}
		})
	}
}

// privatePages sums the copied-on-write pages of the child's mappings of
// path, from /proc/PID/smaps.
func privatePages(t *testing.T, pid int, path string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	kib, inMapping := 0, false
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if strings.Contains(fields[0], "-") && len(fields) >= 5 { // a mapping header
			inMapping = fields[len(fields)-1] == path
			continue
		}
		if inMapping && fields[0] == "Anonymous:" {
			n, err := strconv.Atoi(fields[1])
			if err != nil {
				t.Fatal(err)
			}
			kib += n
		}
	}
	return kib * 1024 / trace.PageBytes
}

// TestWritesCopyPages checks that write entries store to the page (the
// kernel copies the private page) and read entries do not.
func TestWritesCopyPages(t *testing.T) {
	p := reference(t, 6)
	var entries []trace.Entry
	writes := 0
	for i := range 300 {
		w := i%3 == 0
		if w {
			writes++
		}
		entries = append(entries, trace.Entry{Offset: int64(i) * 5 * trace.PageBytes, Write: w})
	}
	path := filepath.Join(t.TempDir(), "trace")
	if err := trace.WriteFile(path, entries); err != nil {
		t.Fatal(err)
	}
	want, err := ExpectedHash(p.Memory, entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	inst := start(t, t.Context(), &VMM{TracePath: path}, fileSpec(p.Memory, layout.Single(testMemoryBytes)))
	info, err := inst.WaitReady(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Detail["sha256"] != want {
		t.Fatalf("hash %s, want %s: a write changed what was read", info.Detail["sha256"], want)
	}
	if got := privatePages(t, inst.PID(), p.Memory); got != writes {
		t.Fatalf("%d private pages in the memory mapping, want one per write entry (%d)", got, writes)
	}
	inst.RequestStop()
	if err := inst.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestEmptyTrace(t *testing.T) {
	p := reference(t, 1)
	path := filepath.Join(t.TempDir(), "trace")
	if err := trace.WriteFile(path, nil); err != nil {
		t.Fatal(err)
	}
	want, _ := ExpectedHash(p.Memory, nil, nil)
	inst := start(t, t.Context(), &VMM{TracePath: path}, fileSpec(p.Memory, layout.Single(testMemoryBytes)))
	info, err := inst.WaitReady(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	r, _ := inst.Report()
	if info.Detail["sha256"] != want || r.TouchedPages != 0 || r.FirstTouch.Before(r.Start) || r.Ready.Before(r.FirstTouch) {
		t.Fatalf("empty trace: %+v, want hash %s, no pages and ordered times", r, want)
	}
	inst.RequestStop()
	if err := inst.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A VMM that does not exit when asked to stop (stopped by SIGSTOP, hung
// on something else) is killed once its stop timeout has passed, and Wait
// says so, instead of waiting for the caller's whole stop bound.
func TestStopTimeoutKills(t *testing.T) {
	p := reference(t, 1)
	inst := start(t, t.Context(), &VMM{TracePath: p.Trace, StopTimeout: 100 * time.Millisecond}, fileSpec(p.Memory, layout.Single(testMemoryBytes)))
	if _, err := inst.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(inst.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := inst.RequestStop(); err != nil {
		t.Fatal(err)
	}
	guard, cancel := context.WithTimeout(t.Context(), guardTimeout)
	defer cancel()
	if err := inst.Wait(guard); err == nil || !strings.Contains(err.Error(), "did not exit within 100ms of the stop request") {
		t.Fatalf("Wait of a VMM that ignored the stop: %v, want it killed after the stop timeout", err)
	}
	assertGone(t, inst.PID())
}
