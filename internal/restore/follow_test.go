package restore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/restore"
	"warmstart/internal/restore/restoretest"
	"warmstart/internal/startupset"
	"warmstart/internal/trace"
)

// The tests here hold a restore's prefetch reads in a target the test
// controls, let the replay VMM's guest run ahead of them, and check that a
// task following the guest moves to where it faults.

// heldTarget wraps a restore's prefetch target: every read waits for a
// token, or for the target to be opened, or for its task to be cancelled
// (so that a restore held here still stops). It records the reads it let
// through, in order.
type heldTarget struct {
	inner  prefetch.Target
	tokens chan struct{}
	opened chan struct{}
	open   func()

	mu      sync.Mutex
	fetched []prefetch.Range
}

func newHeldTarget() *heldTarget {
	h := &heldTarget{tokens: make(chan struct{}, 1024), opened: make(chan struct{})}
	h.open = sync.OnceFunc(func() { close(h.opened) })
	return h
}

// holdPrefetch makes every restore of r prefetch through h; watch, if
// set, is told of every range the devices serve.
func holdPrefetch(t *testing.T, r *restore.Restorer, h *heldTarget, watch memdev.Observer) {
	r.Devices = restoretest.Watch{Target: func(inner prefetch.Target) prefetch.Target {
		h.inner = inner
		return h
	}, Observer: watch}.Devices(r.Devices)
	t.Cleanup(h.open)
}

func (h *heldTarget) Fetch(ctx context.Context, off int64, buf []byte) error {
	select {
	case <-h.tokens:
	case <-h.opened:
	case <-ctx.Done():
		return ctx.Err()
	}
	h.mu.Lock()
	h.fetched = append(h.fetched, prefetch.Range{Offset: off, Length: int64(len(buf))})
	h.mu.Unlock()
	return h.inner.Fetch(ctx, off, buf)
}

// allow lets n more reads through.
func (h *heldTarget) allow(n int) {
	for range n {
		h.tokens <- struct{}{}
	}
}

func (h *heldTarget) reads() []prefetch.Range {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.fetched)
}

// faultWatch runs onFault, once, from the device's serving goroutine, when
// the device serves a demand request covering page off: by then the
// restore's own observer has told the prefetch task of that request.
type faultWatch struct {
	off     int64
	onFault func()
	once    sync.Once
}

func (w *faultWatch) Served(kind memdev.Kind, off int64, n int, _ time.Duration) {
	if kind == memdev.Demand && off <= w.off && w.off < off+int64(n) {
		w.once.Do(w.onFault)
	}
}

// firstTouches is the pages entries touch, in first-touch order.
func firstTouches(entries []trace.Entry) []int64 {
	seen := map[int64]bool{}
	var out []int64
	for _, en := range entries {
		if p := en.Offset &^ (trace.PageBytes - 1); !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// withPlan returns src with a manifest of pages, in that order, attached.
func withPlan(t *testing.T, e *env, src restore.Source, pages []int64) (restore.Source, *manifest.Manifest) {
	t.Helper()
	data := buildManifest(t, e, pages)
	path := filepath.Join(t.TempDir(), "startup-manifest.bin")
	must(t, os.WriteFile(path, data, 0o444))
	d := manifest.Describe(data)
	m, err := manifest.Verify(data, d, src.Layout)
	must(t, err)
	src.ManifestPath, src.Manifest = path, &d
	return src, m
}

// planRanks maps the offset of each read the engine makes of m (ranges
// split at the buffer size; manifest.Build already joined contiguous
// pages) to its rank in the plan.
func planRanks(m *manifest.Manifest, bufferBytes int64) map[int64]int {
	ranks := map[int64]int{}
	for _, r := range m.Ranges {
		for off := r.Offset; off < r.End(); off += bufferBytes {
			ranks[off] = len(ranks)
		}
	}
	return ranks
}

// rankOfPage is the rank of the plan read holding page off.
func rankOfPage(m *manifest.Manifest, bufferBytes int64, off int64) int {
	rank := 0
	for _, r := range m.Ranges {
		for o := r.Offset; o < r.End(); o += bufferBytes {
			if o <= off && off < min(o+bufferBytes, r.End()) {
				return rank
			}
			rank++
		}
	}
	return -1
}

func followPolicy(t *testing.T, readers int, follow bool) restore.Policy {
	p := exactPolicy(t)
	p.Readers, p.Follow = readers, follow
	return p
}

// followCase is one device's restore of the reference trace with a
// manifest of exactly its first touches, in order, and the page half way
// through them.
type followCase struct {
	e       *env
	device  string
	entries []trace.Entry
	src     restore.Source
	m       *manifest.Manifest
	middle  int64
}

func newFollowCase(t *testing.T, e *env, device string) *followCase {
	pages := firstTouches(e.ref.entries)
	src, m := withPlan(t, e, e.source(t), pages)
	return &followCase{e: e, device: device, entries: e.ref.entries, src: src, m: m, middle: pages[len(pages)/2]}
}

// restoreHeld restores with the prefetch held in h until the guest faults
// c.middle, when onMiddle runs; it returns the instance at ready.
func (c *followCase) restoreHeld(t *testing.T, p restore.Policy, entries []trace.Entry, h *heldTarget, onMiddle func()) (*restore.Instance, *restore.Restorer) {
	t.Helper()
	r, _, expected := c.e.restorerWithTrace(t, entries)
	holdPrefetch(t, r, h, &faultWatch{off: c.middle, onFault: onMiddle})
	inst := c.e.restore(t, r, c.src, restore.Options{Device: c.device, Prefetch: restore.ModeOn, Policy: p})
	checkHash(t, inst, expected)
	return inst, r
}

// With the reads held until the guest is half way through its start-up, a
// following task jumps to the guest, reads from there to the end, then
// the reads it jumped over; every range exactly once, with 1, 2 and 4
// readers, on both devices.
func TestFollowReadsFromTheGuestOnce(t *testing.T) {
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			e := newEnv(t, envOptions{noManifest: true})
			c := newFollowCase(t, e, device)
			for _, readers := range []int{1, 2, 4} {
				t.Run(fmt.Sprintf("%d readers", readers), func(t *testing.T) { c.checkFollowOnce(t, readers) })
			}
		})
	}
}

func (c *followCase) checkFollowOnce(t *testing.T, readers int) {
	before := c.e.restorer.Engine.Stats()
	h := newHeldTarget()
	p := followPolicy(t, readers, true)
	inst, _ := c.restoreHeld(t, p, c.entries, h, h.open)
	sub := restore.PrefetchSubscription(inst)
	waitFor(t, sub.Done(), "the prefetch task to end")
	if st, err := sub.State(), sub.Err(); st != prefetch.Completed {
		t.Fatalf("task ended %v (%v), want completed", st, err)
	}
	stats := c.e.restorer.Engine.Stats()
	if jumps := stats.Jumps - before.Jumps; jumps == 0 {
		t.Error("the guest faulted ahead of the held task, yet its cursor never jumped")
	}
	if deferred := stats.DeferredReads - before.DeferredReads; deferred == 0 {
		t.Error("no read jumped over was done after the end of the plan")
	}
	reads := h.reads()
	checkEachByteOnce(t, reads, c.m.TotalBytes())
	if sub.BytesFetched() != c.m.TotalBytes() {
		t.Errorf("task fetched %d bytes, want the manifest's %d", sub.BytesFetched(), c.m.TotalBytes())
	}
	if readers == 1 {
		checkTwoPasses(t, reads, planRanks(c.m, int64(p.BufferBytes)))
	}
	stop(t, inst)
}

// checkEachByteOnce fails unless reads cover total bytes without overlap.
func checkEachByteOnce(t *testing.T, reads []prefetch.Range, total int64) {
	t.Helper()
	reads = slices.Clone(reads)
	slices.SortFunc(reads, func(a, b prefetch.Range) int { return int(a.Offset - b.Offset) })
	var sum int64
	for i, r := range reads {
		sum += r.Length
		if i > 0 && reads[i-1].Offset+reads[i-1].Length > r.Offset {
			t.Errorf("reads %+v and %+v overlap: memory read twice", reads[i-1], r)
		}
	}
	if sum != total {
		t.Errorf("reads cover %d bytes, want the plan's %d, each once", sum, total)
	}
}

// checkTwoPasses: one reader's reads go forward in plan order (jumping
// ahead), then once back for the reads jumped over, forward again.
func checkTwoPasses(t *testing.T, reads []prefetch.Range, ranks map[int64]int) {
	t.Helper()
	descents := 0
	for i := 1; i < len(reads); i++ {
		a, okA := ranks[reads[i-1].Offset]
		b, okB := ranks[reads[i].Offset]
		if !okA || !okB {
			t.Fatalf("read at %d or %d is not one of the plan's", reads[i-1].Offset, reads[i].Offset)
		}
		if b < a {
			descents++
		}
	}
	if descents != 1 {
		t.Errorf("the reader went back in the plan %d times, want once: ahead with the guest, then the reads it passed", descents)
	}
}

// When the guest only faults memory outside the plan, a following task
// reads in plan order, and nothing jumps.
func TestFollowIgnoresFaultsOutsideThePlan(t *testing.T) {
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			e := newEnv(t, envOptions{noManifest: true})
			var low []int64
			for _, p := range firstTouches(e.ref.entries) {
				if p < memoryBytes/4 {
					low = append(low, p)
				}
			}
			if len(low) < 16 {
				t.Fatalf("the trace touches %d pages in the first quarter of memory: too few to plan", len(low))
			}
			src, m := withPlan(t, e, e.source(t), low)
			far := farTrace(t, 0) // half the memory away from 0: far above every planned page
			if far[0].Offset < memoryBytes/4+(1<<20) {
				t.Fatalf("far trace at %d is near the plan", far[0].Offset)
			}
			r, _, expected := e.restorerWithTrace(t, far)
			h := newHeldTarget()
			holdPrefetch(t, r, h, nil)
			before := e.restorer.Engine.Stats()
			inst := e.restore(t, r, src, restore.Options{Device: device, Prefetch: restore.ModeOn, Policy: followPolicy(t, 1, true)})
			checkHash(t, inst, expected)
			h.open() // the guest is ready: it faulted all it will
			sub := restore.PrefetchSubscription(inst)
			waitFor(t, sub.Done(), "the prefetch task to end")
			if st := e.restorer.Engine.Stats(); st.Jumps != before.Jumps || st.DeferredReads != before.DeferredReads {
				t.Errorf("faults outside the plan moved the cursor: %d jumps, %d deferred reads", st.Jumps-before.Jumps, st.DeferredReads-before.DeferredReads)
			}
			ranks := planRanks(m, 1<<20)
			for i, rd := range h.reads() {
				if ranks[rd.Offset] != i {
					t.Fatalf("read %d at %d has rank %d: want plan order", i, rd.Offset, ranks[rd.Offset])
				}
			}
			stop(t, inst)
		})
	}
}

// A guest that runs ahead of a slow prefetch finds more of its start-up
// in memory when the prefetch follows it. The prefetch is held until the
// guest is half way, then allowed a fixed number of reads and held again,
// while the guest computes for a moment: without follow those reads are
// the plan's first, all behind the guest (nothing in time); with follow
// they are the reads from the guest on. The file device is mounted with a
// one-page readahead window, so that the pages after the guest's are not
// already brought in (on demand, hence late) by the kernel's readaround.
func TestFollowMakesFewerLatePages(t *testing.T) {
	const budget = 16
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			e := newEnv(t, envOptions{noManifest: true, readAheadBytes: startupset.PageBytes})
			c := newFollowCase(t, e, device)
			p := policy(t, "warmstart")
			if rank := rankOfPage(c.m, int64(p.BufferBytes), c.middle); rank <= budget+p.Readers {
				t.Fatalf("the guest's half-way page is in read %d: too early for %d reads to be all behind it", rank, budget)
			}
			entries := pauseAfter(c.entries, c.middle, 250*time.Millisecond)
			late := map[bool]startupset.Report{}
			for _, follow := range []bool{false, true} {
				h := newHeldTarget()
				inst, _ := c.restoreHeld(t, followPolicy(t, p.Readers, follow), entries, h, func() { h.allow(budget) })
				stop(t, inst)
				late[follow] = inst.StartupSet
				t.Logf("follow %v: %s", follow, startupset.Line(inst.StartupSet))
			}
			off, on := late[false], late[true]
			if off.InTimePages != 0 {
				t.Errorf("without follow %d pages were in time; the reads allowed were all behind the guest", off.InTimePages)
			}
			if on.LatePages >= off.LatePages || on.InTimePages == 0 {
				t.Errorf("late pages with follow %d, without %d (in time %d and %d): want fewer with follow",
					on.LatePages, off.LatePages, on.InTimePages, off.InTimePages)
			}
		})
	}
}

// pauseAfter returns entries with pause added to the guest's compute time
// after its first touch of page off.
func pauseAfter(entries []trace.Entry, off int64, pause time.Duration) []trace.Entry {
	out := slices.Clone(entries)
	for i, en := range out {
		if en.Offset&^(trace.PageBytes-1) == off && i+1 < len(out) {
			out[i+1].Compute += pause
			break
		}
	}
	return out
}
