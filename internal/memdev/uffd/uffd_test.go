package uffd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"warmstart/internal/memdev"
	"warmstart/internal/userfaultfd"
)

// TestRandomTracesReadLowerFileBytes: the VMM reads, in random orders with
// repeats and writes, exactly the bytes of the lower file, each page is read
// from the lower file once, and the trace is the order of first touches.
func TestRandomTracesReadLowerFileBytes(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			f := newFixture(t, Options{Trace: true})
			rng := rand.New(rand.NewPCG(seed, 42))
			pages := f.pages()
			var steps []step
			for len(steps) < 600 {
				// Runs of neighbouring pages, like a guest walking its text,
				// mixed with scattered single pages.
				start := rng.IntN(len(pages))
				run := 1
				if rng.IntN(3) == 0 {
					run = 1 + rng.IntN(16)
				}
				for i := start; i < min(start+run, len(pages)); i++ {
					mode := []string{"r", "r", "r", "rw", "w"}[rng.IntN(5)]
					steps = append(steps, step{Off: pages[i], Mode: mode})
				}
			}
			// Several commands, so that hashes cover the state between them.
			for i := 0; i < len(steps); i += 200 {
				f.touchAndCheck(steps[i:min(i+200, len(steps))]...)
			}

			var first []int64
			seen := map[int64]bool{}
			for _, s := range steps {
				if !seen[s.Off] {
					seen[s.Off] = true
					first = append(first, s.Off)
				}
			}
			trace := f.s.Trace()
			got := make([]int64, len(trace))
			for i, tc := range trace {
				got[i] = tc.Offset
				if i > 0 && tc.Nanos < trace[i-1].Nanos {
					t.Fatalf("trace times go backwards at %d: %d < %d", i, tc.Nanos, trace[i-1].Nanos)
				}
			}
			if !slices.Equal(got, first) {
				t.Fatalf("trace has %d touches, want the %d first touches in order", len(got), len(first))
			}
			st, c := f.s.Stats(), f.s.Counters()
			n := uint64(len(first))
			if st.Faults != n || c.ReadRequests != n || c.BytesRead != n*userfaultfd.PageSizeBytes {
				t.Fatalf("faults %d, read requests %d, bytes read %d; want %d pages", st.Faults, c.ReadRequests, c.BytesRead, n)
			}
			if c.ReadErrors != 0 || c.BytesInFlight != 0 {
				t.Fatalf("counters %+v", c)
			}
		})
	}
}

func TestStopTraceStopsRecording(t *testing.T) {
	f := newFixture(t, Options{})
	f.touchAndCheck(reads(0)...)
	if n := len(f.s.Trace()); n != 0 {
		t.Fatalf("trace has %d touches before StartTrace", n)
	}
	f.s.StartTrace()
	f.touchAndCheck(reads(userfaultfd.PageSizeBytes, 0, 2*userfaultfd.PageSizeBytes)...)
	f.s.StopTrace()
	f.touchAndCheck(reads(3 * userfaultfd.PageSizeBytes)...)
	got := f.s.Trace()
	if len(got) != 2 || got[0].Offset != userfaultfd.PageSizeBytes || got[1].Offset != 2*userfaultfd.PageSizeBytes {
		t.Fatalf("trace %+v, want pages 1 and 2", got)
	}
}

// TestRemovedPagesReadZeros: after MADV_DONTNEED, pages read zeros whether
// or not they had been faulted before, and Install leaves them alone.
func TestRemovedPagesReadZeros(t *testing.T) {
	f := newFixture(t, Options{})
	base := int64(2 << 20)
	var before []int64
	for i := int64(0); i < 32; i += 2 {
		before = append(before, base+i*userfaultfd.PageSizeBytes)
	}
	f.touchAndCheck(reads(before...)...)
	f.touchAndCheck(step{Off: base + 4*userfaultfd.PageSizeBytes, Mode: "w"})

	removeOff, removeLen := base+userfaultfd.PageSizeBytes*8, int64(16*userfaultfd.PageSizeBytes)
	f.v.madvise(removeOff, removeLen)
	f.model.remove(removeOff, removeLen)

	if err := f.s.Install(context.Background(), base, 32*userfaultfd.PageSizeBytes); err != nil {
		t.Fatal(err)
	}
	var all []step
	for i := int64(0); i < 32; i++ {
		all = append(all, step{Off: base + i*userfaultfd.PageSizeBytes, Mode: "r"})
	}
	all = append(all, step{Off: removeOff, Mode: "rw"}, step{Off: removeOff, Mode: "r"})
	f.touchAndCheck(all...)

	st := f.s.Stats()
	if st.Removes != 1 || st.RemovedBytes != uint64(removeLen) {
		t.Fatalf("removes %d (%d bytes), want 1 (%d bytes)", st.Removes, st.RemovedBytes, removeLen)
	}
	// Every removed page faults once after the discard and gets zeros;
	// Install filled the other 16 - 8 = 8 pages not faulted before.
	if st.ZeroPages != 16 {
		t.Fatalf("zero pages %d, want 16", st.ZeroPages)
	}
	if st.InstalledBytes != 8*userfaultfd.PageSizeBytes {
		t.Fatalf("installed %d bytes, want %d", st.InstalledBytes, 8*userfaultfd.PageSizeBytes)
	}
}

// TestInstalledPagesDoNotFault: pages installed ahead of the guest are read
// without a fault (and so without a touch), and hold the lower file's bytes.
func TestInstalledPagesDoNotFault(t *testing.T) {
	f := newFixture(t, Options{Trace: true})
	ctx := context.Background()
	// Unaligned ranges are rounded out to pages; the second crosses the
	// end of region 0 into nothing, so it is cut to one page at the end.
	if err := f.s.Install(ctx, 100, 3*userfaultfd.PageSizeBytes); err != nil { // pages 0..3
		t.Fatal(err)
	}
	if err := f.s.Install(ctx, (2<<20)+10*userfaultfd.PageSizeBytes, 300*userfaultfd.PageSizeBytes); err != nil {
		t.Fatal(err)
	}
	installed := map[int64]bool{}
	for i := int64(0); i < 4; i++ {
		installed[i*userfaultfd.PageSizeBytes] = true
	}
	for i := int64(10); i < 310; i++ {
		installed[(2<<20)+i*userfaultfd.PageSizeBytes] = true
	}
	st := f.s.Stats()
	if st.InstalledBytes != uint64(len(installed))*userfaultfd.PageSizeBytes {
		t.Fatalf("installed %d bytes, want %d", st.InstalledBytes, len(installed)*userfaultfd.PageSizeBytes)
	}

	rng := rand.New(rand.NewPCG(7, 7))
	pages := f.pages()
	var steps []step
	var faulting []int64
	for _, i := range rng.Perm(len(pages))[:400] {
		steps = append(steps, step{Off: pages[i], Mode: "r"})
		if !installed[pages[i]] {
			faulting = append(faulting, pages[i])
		}
	}
	for off := range installed {
		steps = append(steps, step{Off: off, Mode: "rw"})
	}
	f.touchAndCheck(steps...)

	st = f.s.Stats()
	if st.Faults != uint64(len(faulting)) {
		t.Fatalf("%d faults, want %d (pages not installed)", st.Faults, len(faulting))
	}
	var traced []int64
	for _, tc := range f.s.Trace() {
		traced = append(traced, tc.Offset)
	}
	if !slices.Equal(traced, faulting) {
		t.Fatalf("trace %v\nwant %v", traced, faulting)
	}
	c := f.s.Counters()
	if want := st.InstalledBytes + uint64(len(faulting))*userfaultfd.PageSizeBytes; c.BytesRead != want {
		t.Fatalf("bytes read %d, want %d", c.BytesRead, want)
	}
}

func TestInstallRejectsUnmappedRange(t *testing.T) {
	f := newFixture(t, Options{})
	// [1 MiB, 2 MiB) is the hole between the regions.
	for _, r := range [][2]int64{{1 << 20, userfaultfd.PageSizeBytes}, {(1 << 20) - userfaultfd.PageSizeBytes, 2 * userfaultfd.PageSizeBytes}, {lowerBytes, userfaultfd.PageSizeBytes}} {
		if err := f.s.Install(context.Background(), r[0], r[1]); !errors.Is(err, ErrNotMapped) {
			t.Errorf("Install(%d, %d) = %v, want ErrNotMapped", r[0], r[1], err)
		}
	}
	if err := f.s.Install(context.Background(), 0, 0); err == nil {
		t.Error("Install of an empty range succeeded")
	}
	// The first page was installed before the hole was found.
	f.touchAndCheck(reads((1 << 20) - userfaultfd.PageSizeBytes)...)
	if st := f.s.Stats(); st.Faults != 0 {
		t.Fatalf("%d faults on an installed page", st.Faults)
	}
}

// TestFaultOnPageInstalledMeanwhileWakes: a fault whose page Install places
// while the handler is between reading the fault and copying gets EEXIST
// and is answered with a wake.
func TestFaultOnPageInstalledMeanwhileWakes(t *testing.T) {
	const p = 5 * userfaultfd.PageSizeBytes
	paused, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f := newFixture(t, Options{hooks: &testHooks{beforeFaultCopy: func(logical int64) {
		if logical == p {
			once.Do(func() { close(paused); <-release })
		}
	}}})
	want := f.model.touch(reads(p)...)
	touched := f.v.send(childCmd{Op: "touch", Steps: reads(p)})
	await(t, paused, "fault on the page")
	if err := f.s.Install(context.Background(), p, userfaultfd.PageSizeBytes); err != nil {
		t.Fatal(err)
	}
	// Install's wake lets the VMM read the page before the handler copies.
	if got := f.v.wait(touched).Hash; got != want {
		t.Fatalf("hash %s, want %s", got, want)
	}
	close(release)
	// Faults are served in order: once a later fault is served, the
	// handler has answered the first one.
	f.touchAndCheck(reads(9 * userfaultfd.PageSizeBytes)...)
	st := f.s.Stats()
	if st.ExistWakes != 1 || st.InstalledBytes != userfaultfd.PageSizeBytes || st.Faults != 2 {
		t.Fatalf("stats %+v, want 1 exist wake, 1 page installed, 2 faults", st)
	}
}

// TestInstallStepsOverPageFaultedMeanwhile: a page the guest faults in while
// Install is about to copy its run makes the copy stop short and then fail
// with EEXIST on that page; Install continues after it.
func TestInstallStepsOverPageFaultedMeanwhile(t *testing.T) {
	base := int64(2 << 20)
	p := base + 5*userfaultfd.PageSizeBytes
	var f *fixture
	var once sync.Once
	f = newFixture(t, Options{hooks: &testHooks{beforeInstallCopy: func(logical, length int64) {
		once.Do(func() { f.touchAndCheck(reads(p)...) })
	}}})
	if err := f.s.Install(context.Background(), base, 16*userfaultfd.PageSizeBytes); err != nil {
		t.Fatal(err)
	}
	st := f.s.Stats()
	if st.InstallExisting != 1 || st.InstalledBytes != 15*userfaultfd.PageSizeBytes || st.Faults != 1 {
		t.Fatalf("stats %+v, want 1 existing page, 15 pages installed, 1 fault", st)
	}
	var all []step
	for i := int64(0); i < 16; i++ {
		all = append(all, step{Off: base + i*userfaultfd.PageSizeBytes, Mode: "rw"})
	}
	f.touchAndCheck(all...)
	if st := f.s.Stats(); st.Faults != 1 {
		t.Fatalf("%d faults after install, want 1", st.Faults)
	}
}

// TestFaultDeferredWhileRemovePending: a fault copied while a REMOVE event
// is queued is refused with EAGAIN; the handler reads the event and then
// serves the fault, with zeros if the page was discarded.
func TestFaultDeferredWhileRemovePending(t *testing.T) {
	const p = 20 * userfaultfd.PageSizeBytes
	for _, tc := range []struct {
		name                 string
		removeOff, removeLen int64
	}{
		{"fault inside removed range", 16 * userfaultfd.PageSizeBytes, 8 * userfaultfd.PageSizeBytes},
		{"fault outside removed range", 40 * userfaultfd.PageSizeBytes, 8 * userfaultfd.PageSizeBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			paused, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			f := newFixture(t, Options{hooks: &testHooks{beforeFaultCopy: func(logical int64) {
				if logical == p {
					once.Do(func() { close(paused); <-release })
				}
			}}})
			touched := f.v.send(childCmd{Op: "touch", Steps: reads(p)})
			await(t, paused, "fault on the page")
			removed := f.v.send(childCmd{Op: "madvise", Off: tc.removeOff, Len: tc.removeLen})
			// The discarding thread has queued its event (and the kernel
			// refuses copies) once the userfaultfd turns readable: the
			// only fault is already read.
			pfd := []unix.PollFd{{Fd: int32(f.s.uffd), Events: unix.POLLIN}}
			for pfd[0].Revents&unix.POLLIN == 0 {
				if _, err := unix.Poll(pfd, int(guardTimeout.Milliseconds())); err != nil && err != unix.EINTR {
					t.Fatal(err)
				}
			}
			close(release)

			f.model.remove(tc.removeOff, tc.removeLen)
			want := f.model.touch(reads(p)...)
			if got := f.v.wait(touched).Hash; got != want {
				t.Fatalf("hash %s, want %s", got, want)
			}
			f.v.wait(removed)
			st := f.s.Stats()
			if st.AgainRetries == 0 || st.Removes != 1 {
				t.Fatalf("stats %+v, want EAGAIN retries and 1 remove", st)
			}
			inside := p >= tc.removeOff && p < tc.removeOff+tc.removeLen
			if (st.ZeroPages == 1) != inside {
				t.Fatalf("zero pages %d, fault inside removed range %v", st.ZeroPages, inside)
			}
			// The rest of the range reads zeros, the rest of memory does not.
			f.touchAndCheck(reads(tc.removeOff, tc.removeOff+tc.removeLen, 0)...)
		})
	}
}

// TestInstallRacingFaults: installs of overlapping ranges run while the
// guest faults the same pages in random order; every byte is right.
func TestInstallRacingFaults(t *testing.T) {
	faulting := make(chan struct{})
	var once sync.Once
	f := newFixture(t, Options{InstallChunkBytes: 16 << 10, hooks: &testHooks{beforeFaultCopy: func(int64) {
		once.Do(func() { close(faulting) })
	}}})
	base := int64(2 << 20)
	n := 512
	rng := rand.New(rand.NewPCG(3, 9))
	var steps []step
	for _, i := range rng.Perm(n) {
		steps = append(steps, step{Off: base + int64(i)*userfaultfd.PageSizeBytes, Mode: []string{"r", "rw"}[i%2]})
	}
	want := f.model.touch(steps...)
	touched := f.v.send(childCmd{Op: "touch", Steps: steps})
	await(t, faulting, "first fault")
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, r := range [][2]int64{{0, 300}, {200, 512}, {100, 400}} {
		wg.Go(func() {
			errs <- f.s.Install(context.Background(), base+r[0]*userfaultfd.PageSizeBytes, (r[1]-r[0])*userfaultfd.PageSizeBytes)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := f.v.wait(touched).Hash; got != want {
		t.Fatalf("hash %s, want %s", got, want)
	}
	// Every page was placed exactly once, by a fault or an install.
	f.touchAndCheck(steps...)
	st, c := f.s.Stats(), f.s.Counters()
	if c.ReadErrors != 0 || c.BytesInFlight != 0 {
		t.Fatalf("counters %+v", c)
	}
	t.Logf("faults %d, installed %d pages, existing %d, exist wakes %d", st.Faults, st.InstalledBytes/userfaultfd.PageSizeBytes, st.InstallExisting, st.ExistWakes)
}

// TestTruncatedLowerFileFailsSession: a page the lower file can no longer
// supply is never served with other bytes; the session fails, counts the
// error, and the handler keeps serving other VMs.
func TestTruncatedLowerFileFailsSession(t *testing.T) {
	f := newFixture(t, Options{})
	f.touchAndCheck(reads(0, 3<<20)...)
	if err := os.Truncate(f.lowerPath, 3<<20); err != nil {
		t.Fatal(err)
	}
	stuck := f.v.send(childCmd{Op: "touch", Steps: reads((3 << 20) + 8*userfaultfd.PageSizeBytes)})
	await(t, f.s.Done(), "session to fail")
	if err := f.s.Err(); !errors.Is(err, ErrLowerFile) {
		t.Fatalf("session error %v, want ErrLowerFile", err)
	}
	if c := f.s.Counters(); c.ReadErrors != 1 {
		t.Fatalf("read errors %d, want 1", c.ReadErrors)
	}
	if err := f.s.Install(context.Background(), 0, userfaultfd.PageSizeBytes); !errors.Is(err, ErrClosed) {
		t.Fatalf("Install on failed session: %v, want ErrClosed", err)
	}
	// The VMM is stuck in the fault; only killing it ends it.
	f.v.kill()
	<-f.v.exited
	select {
	case r := <-stuck:
		t.Fatalf("VMM read a page the handler could not serve: %+v", r)
	default:
	}

	// A handler of the shorter file (its size is the lower's when it is
	// opened) refuses at the handshake a VMM whose regions reach past it.
	f.h.Close()
	f.socket = filepath.Join(f.dir, "short.sock")
	h, err := Listen(f.socket, openLower(t, f.lowerPath), Options{})
	if err != nil {
		t.Fatal(err)
	}
	f.h = h
	t.Cleanup(func() { h.Close() })
	accepted := make(chan error, 1)
	go func() {
		s, err := f.h.Accept(context.Background())
		if s != nil {
			s.Close()
		}
		accepted <- err
	}()
	startVMM(t, f.socket, f.regions)
	if err := await(t, accepted, "accept"); !errors.Is(err, ErrBadHandshake) {
		t.Fatalf("accept of regions past the file: %v, want ErrBadHandshake", err)
	}
	// One inside it is served.
	f.v, f.s = f.connect([]testRegion{{Offset: 0, Size: 3 << 20}})
	f.touchAndCheck(reads(0, (3<<20)-userfaultfd.PageSizeBytes)...)
}

// TestVMMExitEndsSession: the VMM's exit ends the session, which learns of
// it from a pidfd because the userfaultfd never signals it.
func TestVMMExitEndsSession(t *testing.T) {
	f := newFixture(t, Options{})
	f.touchAndCheck(reads(0)...)
	f.v.send(childCmd{Op: "exit"})
	await(t, f.s.Done(), "session end")
	if err := f.s.Err(); !errors.Is(err, ErrVMMExited) {
		t.Fatalf("session error %v, want ErrVMMExited", err)
	}
}

func TestCloseStopsServing(t *testing.T) {
	f := newFixture(t, Options{})
	f.touchAndCheck(reads(0)...)
	if err := f.s.Close(); err != nil {
		t.Fatal(err)
	}
	await(t, f.s.Done(), "done")
	if err := f.s.Err(); err != nil {
		t.Fatalf("Err after Close = %v, want nil", err)
	}
	if err := f.s.Install(context.Background(), 0, userfaultfd.PageSizeBytes); !errors.Is(err, ErrClosed) {
		t.Fatalf("Install after Close: %v, want ErrClosed", err)
	}
	if err := f.h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file after Close: %v", err)
	}
	if _, err := f.h.Accept(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Accept after Close: %v, want ErrClosed", err)
	}
}

func TestHandlerCloseClosesSessions(t *testing.T) {
	f := newFixture(t, Options{})
	if err := f.h.Close(); err != nil {
		t.Fatal(err)
	}
	await(t, f.s.Done(), "session end")
}

// TestHandshake drives Accept with handshakes sent from this process; no
// memory is registered, so nothing faults here.
func TestHandshake(t *testing.T) {
	f := newHandler(t, Options{})
	uffd, err := userfaultfd.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(uffd)
	uffd2, err := userfaultfd.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(uffd2)
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])

	one := `[{"base_host_virt_addr":139637976727552,"size":1048576,"offset":0,"page_size":4096}]`
	// Firecracker 1.7 to 1.11 sent the page size in bytes in a field
	// named page_size_kib; 1.12 and later send it as page_size too.
	kib := func(pageSizeKiB, pageSize, size int) string {
		region := fmt.Sprintf(`"base_host_virt_addr":139637976727552,"size":%d,"offset":0,"page_size_kib":%d`, size, pageSizeKiB)
		if pageSize > 0 {
			region += fmt.Sprintf(`,"page_size":%d`, pageSize)
		}
		return "[{" + region + "}]"
	}
	cases := []struct {
		name     string
		body     string
		fds      []int
		split    bool   // send the body in two writes
		ok       bool   // accepted, with pageSize
		pageSize uint64 // userfaultfd.PageSizeBytes when zero
	}{
		{name: "valid", body: one, fds: []int{uffd}, ok: true},
		{name: "page_size_kib in bytes (1.7 to 1.11)", body: kib(4096, 0, 1<<20), fds: []int{uffd}, ok: true},
		{name: "page_size_kib of 2 MiB huge pages, in bytes", body: kib(2<<20, 0, 2<<20), fds: []int{uffd}, ok: true, pageSize: 2 << 20},
		{name: "both fields (1.12 and later)", body: kib(4096, 4096, 1<<20), fds: []int{uffd}, ok: true},
		{name: "page_size_kib read as KiB", body: kib(4, 0, 1<<20), fds: []int{uffd}},
		{name: "both fields disagree", body: kib(4, 4096, 1<<20), fds: []int{uffd}},
		{name: "body in two writes", body: manyRegions(300), fds: []int{uffd}, split: true, ok: true},
		{name: "empty list", body: `[]`, fds: []int{uffd}},
		{name: "malformed", body: `[{"base_host_virt_addr":`, fds: []int{uffd}},
		{name: "no fd", body: one},
		{name: "two fds", body: one, fds: []int{uffd, uffd2}},
		{name: "not a userfaultfd", body: one, fds: []int{pipe[0]}},
		{name: "missing page size", body: `[{"base_host_virt_addr":139637976727552,"size":4096,"offset":0}]`, fds: []int{uffd}},
		{name: "page size not a power of two", body: `[{"base_host_virt_addr":139637976727552,"size":12288,"offset":0,"page_size":12288}]`, fds: []int{uffd}},
		{name: "unaligned base", body: `[{"base_host_virt_addr":139637976727553,"size":4096,"offset":0,"page_size":4096}]`, fds: []int{uffd}},
		{name: "zero size", body: `[{"base_host_virt_addr":139637976727552,"size":0,"offset":0,"page_size":4096}]`, fds: []int{uffd}},
		{name: "past the lower file", body: `[{"base_host_virt_addr":139637976727552,"size":8192,"offset":4190208,"page_size":4096}]`, fds: []int{uffd}},
		{name: "overlap in address space", body: `[{"base_host_virt_addr":139637976727552,"size":8192,"offset":0,"page_size":4096},{"base_host_virt_addr":139637976731648,"size":4096,"offset":65536,"page_size":4096}]`, fds: []int{uffd}},
		{name: "overlap in file", body: `[{"base_host_virt_addr":139637976727552,"size":8192,"offset":0,"page_size":4096},{"base_host_virt_addr":139637977776128,"size":4096,"offset":4096,"page_size":4096}]`, fds: []int{uffd}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			accepted := make(chan error, 1)
			var s *Session
			go func() {
				var err error
				s, err = f.h.Accept(context.Background())
				accepted <- err
			}()
			conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: f.socket, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			body := []byte(tc.body)
			first := body
			if tc.split {
				first = body[:len(body)/2]
			}
			var oob []byte
			if len(tc.fds) > 0 {
				oob = unix.UnixRights(tc.fds...)
			}
			if _, _, err := conn.WriteMsgUnix(first, oob, nil); err != nil {
				t.Fatal(err)
			}
			if tc.split {
				if _, err := conn.Write(body[len(first):]); err != nil {
					t.Fatal(err)
				}
			}
			if !json.Valid(body) {
				conn.CloseWrite()
			}
			err = await(t, accepted, "accept")
			if tc.ok {
				if err != nil {
					t.Fatalf("accept: %v", err)
				}
				defer s.Close()
				want := tc.pageSize
				if want == 0 {
					want = userfaultfd.PageSizeBytes
				}
				if ms := s.Mappings(); ms[0].PageSize != want {
					t.Fatalf("mappings %+v, want page size %d", ms, want)
				}
				return
			}
			if !errors.Is(err, ErrBadHandshake) {
				t.Fatalf("accept: %v, want ErrBadHandshake", err)
			}
			t.Logf("%v", err)
		})
	}
}

func manyRegions(n int) string {
	var b []byte
	b = append(b, '[')
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, []byte(`{"base_host_virt_addr":`+strconv.FormatUint(0x7f0000000000+uint64(i)*8192, 10)+`,"size":4096,"offset":`+strconv.FormatUint(uint64(i)*8192, 10)+`,"page_size":4096}`)...)
	}
	return string(append(b, ']'))
}

func TestAcceptHonoursContext(t *testing.T) {
	f := newHandler(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	accepted := make(chan error, 1)
	go func() {
		_, err := f.h.Accept(ctx)
		accepted <- err
	}()
	cancel()
	if err := await(t, accepted, "accept"); !errors.Is(err, context.Canceled) {
		t.Fatalf("accept: %v, want context.Canceled", err)
	}
	// The listener still works afterwards.
	v, s := f.connect(f.regions)
	f.v, f.s = v, s
	f.touchAndCheck(reads(0)...)
}

func TestListenReplacesStaleSocket(t *testing.T) {
	f := newHandler(t, Options{})
	if _, err := Listen(f.socket, openLower(t, f.lowerPath), Options{}); !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("second Listen on a live socket: %v, want ErrSocketInUse", err)
	}
	stale := f.socket + ".stale"
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	h, err := Listen(stale, openLower(t, f.lowerPath), Options{})
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	h.Close()
	if _, err := Listen(f.lowerPath, openLower(t, f.lowerPath), Options{}); err == nil {
		t.Fatal("Listen over a regular file succeeded")
	}
}

// TestCloseAbandonsSilentHandshake: a VMM that connects and sends nothing
// does not keep Accept, or Close, waiting.
func TestCloseAbandonsSilentHandshake(t *testing.T) {
	f := newHandler(t, Options{})
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: f.socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	accepted := make(chan error, 1)
	go func() {
		_, err := f.h.Accept(context.Background())
		accepted <- err
	}()
	if err := f.h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := await(t, accepted, "accept"); !errors.Is(err, ErrClosed) {
		t.Fatalf("accept: %v, want ErrClosed", err)
	}
}

// TestInstallDeferredWhileRemovePending: Install's copy is refused with
// EAGAIN while a REMOVE event is unread; it waits for the handler to drain
// it and then skips the discarded pages.
func TestInstallDeferredWhileRemovePending(t *testing.T) {
	base := int64(2 << 20)
	q := base + 100*userfaultfd.PageSizeBytes
	removeOff, removeLen := base+8*userfaultfd.PageSizeBytes, int64(8*userfaultfd.PageSizeBytes)
	faultPaused, releaseFault := make(chan struct{}), make(chan struct{})
	var pauseOnce sync.Once
	var f *fixture
	var removed <-chan childReply
	installCalls := 0
	f = newFixture(t, Options{hooks: &testHooks{
		beforeFaultCopy: func(logical int64) {
			if logical == q {
				pauseOnce.Do(func() { close(faultPaused); <-releaseFault })
			}
		},
		beforeInstallCopy: func(logical, length int64) {
			installCalls++
			switch installCalls {
			case 1:
				// The serving goroutine is held, so the event stays unread.
				removed = f.v.send(childCmd{Op: "madvise", Off: removeOff, Len: removeLen})
				pfd := []unix.PollFd{{Fd: int32(f.s.uffd), Events: unix.POLLIN}}
				for pfd[0].Revents&unix.POLLIN == 0 {
					if _, err := unix.Poll(pfd, int(guardTimeout.Milliseconds())); err != nil && err != unix.EINTR {
						t.Error(err)
						return
					}
				}
			case 2:
				// Install has been refused once; let the handler drain.
				close(releaseFault)
			}
		},
	}})
	touched := f.v.send(childCmd{Op: "touch", Steps: reads(q)})
	await(t, faultPaused, "fault on q")
	if err := f.s.Install(context.Background(), base, 32*userfaultfd.PageSizeBytes); err != nil {
		t.Fatal(err)
	}
	f.v.wait(removed)
	f.model.remove(removeOff, removeLen)
	want := f.model.touch(reads(q)...)
	if got := f.v.wait(touched).Hash; got != want {
		t.Fatalf("hash %s, want %s", got, want)
	}
	st := f.s.Stats()
	if st.AgainRetries < 2 {
		t.Fatalf("%d EAGAIN retries, want the install's and the fault's", st.AgainRetries)
	}
	if st.InstalledBytes != uint64(32*userfaultfd.PageSizeBytes-removeLen) {
		t.Fatalf("installed %d bytes, want %d (removed pages skipped)", st.InstalledBytes, 32*userfaultfd.PageSizeBytes-removeLen)
	}
	var all []step
	for i := int64(0); i < 32; i++ {
		all = append(all, step{Off: base + i*userfaultfd.PageSizeBytes, Mode: "r"})
	}
	f.touchAndCheck(all...)
	if st := f.s.Stats(); st.ZeroPages != 8 || st.Faults != 9 {
		t.Fatalf("stats %+v, want 8 zero pages and 9 faults", st)
	}
}

// demandLog is an observer that keeps the offsets of demand reports.
type demandLog struct {
	mu   sync.Mutex
	offs []int64
}

func (l *demandLog) Served(kind memdev.Kind, off int64, n int, took time.Duration) {
	if kind != memdev.Demand {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.offs = append(l.offs, off)
}

func (l *demandLog) has(off int64) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.offs, off), len(l.offs)
}

// TestFaultIsReportedBeforeTheCopyWakesTheGuest: the copy wakes the guest,
// which may then report ready before the handler runs again; a restore
// takes its events at ready, so the demand must be reported by then. A
// page that Install placed meanwhile is still one report, not two.
func TestFaultIsReportedBeforeTheCopyWakesTheGuest(t *testing.T) {
	const p = 7 * userfaultfd.PageSizeBytes
	log := &demandLog{}
	var reportedFirst atomic.Bool
	f := newFixture(t, Options{Observer: log, hooks: &testHooks{beforeFaultCopy: func(logical int64) {
		if ok, _ := log.has(logical); ok && logical == p {
			reportedFirst.Store(true)
		}
	}}})
	f.touchAndCheck(reads(p)...)
	if !reportedFirst.Load() {
		t.Fatal("the fault's demand was not reported before its copy")
	}
	if _, n := log.has(p); n != 1 {
		t.Fatalf("%d demand reports for one fault, want 1", n)
	}
}
