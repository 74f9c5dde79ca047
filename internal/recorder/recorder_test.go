package recorder_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"warmstart/internal/config"
	"warmstart/internal/manifest"
	"warmstart/internal/recorder"
	"warmstart/internal/trace"
)

// TestRecordedManifestIsTraceCoalesced: on the uffd device every first
// touch is one fault, so the recorded manifest is exactly the trace's
// distinct pages in first-touch order with adjacent pages coalesced. On the
// file device readaround makes requests larger than a touch, so there the
// manifest covers every touched page and starts where the guest did.
func TestRecordedManifestIsTraceCoalesced(t *testing.T) {
	e := newEnv(t)
	want := traceManifest(t, e)
	wantData, err := manifest.Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	distinct := trace.Summarize(e.ref.entries).Pages
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			ctx := context.Background()
			id, lease := e.publish(t)
			res, err := jobResult(t, e.recorder(device).Start(ctx, lease))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-lease.Done():
			default:
				t.Error("the lease is still held after the recording ended")
			}
			resolved, err := e.repo.Resolve(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if resolved.Record.Manifest == nil || *resolved.Record.Manifest != res.Descriptor {
				t.Fatalf("record descriptor %+v, recorder reported %+v", resolved.Record.Manifest, res.Descriptor)
			}
			data, err := os.ReadFile(resolved.ManifestPath)
			if err != nil {
				t.Fatal(err)
			}
			e.checkAttached(t, id, res.Descriptor, data)
			got, err := manifest.Verify(data, manifest.Descriptor{SHA256: res.Descriptor.SHA256, Size: res.Descriptor.Size}, e.ref.layout)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d ranges, %d bytes from %d touches; the trace has %d ranges, %d bytes",
				device, len(got.Ranges), got.TotalBytes(), res.Touches, len(want.Ranges), want.TotalBytes())
			if res.Ranges != len(got.Ranges) || res.Bytes != got.TotalBytes() {
				t.Errorf("result says %d ranges, %d bytes; the manifest has %d, %d", res.Ranges, res.Bytes, len(got.Ranges), got.TotalBytes())
			}
			if device == config.DeviceUffd {
				if !slices.Equal(got.Ranges, want.Ranges) {
					t.Errorf("manifest ranges differ from the trace's coalesced pages: got %d ranges, want %d", len(got.Ranges), len(want.Ranges))
				}
				if string(data) != string(wantData) {
					t.Error("manifest bytes differ from the encoding of the trace's coalesced pages")
				}
				if res.Touches != distinct {
					t.Errorf("%d touches recorded, the trace has %d distinct pages", res.Touches, distinct)
				}
				return
			}
			covered := make(map[int64]bool)
			for _, r := range got.Ranges {
				for p := r.Offset; p < r.End(); p += trace.PageBytes {
					covered[p] = true
				}
			}
			for _, en := range e.ref.entries {
				if !covered[en.Offset] {
					t.Fatalf("touched page %d is not in the manifest", en.Offset)
				}
			}
			if r, first := got.Ranges[0], e.ref.entries[0].Offset; first < r.Offset || first >= r.End() {
				t.Errorf("first range [%d, %d) does not hold the first touch %d", r.Offset, r.End(), first)
			}
		})
	}
}

// TestLeaseHeldDuringRecording: the background recording holds the capture
// lease until it ends; a deletion meanwhile makes it discard its work and
// leaves nothing behind.
func TestLeaseHeldDuringRecording(t *testing.T) {
	e := newEnv(t)
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			ctx := context.Background()
			id, lease := e.publish(t)
			held, proceed := make(chan struct{}), make(chan struct{})
			var release sync.Once
			open := func() { release.Do(func() { close(proceed) }) }
			t.Cleanup(open)
			e.vm.setBeforeStart(func() {
				close(held)
				<-proceed
			})
			defer e.vm.setBeforeStart(nil)
			job := e.recorder(device).Start(ctx, lease)
			waitFor(t, held, "the recording's VMM to start")

			select {
			case <-lease.Done():
				t.Fatal("the lease ended while the recording runs")
			default:
			}
			// Other processes see the lease too: its lock cannot be taken
			// exclusively.
			f, err := os.Open(filepath.Join(e.repo.Root(), "catalog", "leases", id+".lock"))
			if err != nil {
				t.Fatalf("lease lock file: %v", err)
			}
			if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
				t.Errorf("exclusive lock of the lease file: %v, want EWOULDBLOCK while the recording holds it", err)
			}
			f.Close()

			if err := e.repo.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			open()
			_, err = jobResult(t, job)
			if !errors.Is(err, recorder.ErrDiscarded) {
				t.Fatalf("recording of a deleted snapshot ended with %v, want ErrDiscarded", err)
			}
			select {
			case <-lease.Done():
			default:
				t.Error("the lease is still held after the recording ended")
			}
			e.checkGone(t, id)
		})
	}
}

// TestPublicationRacingDeletion deletes the snapshot at every point of its
// background recording, and at no fixed point at all: the recording either
// attached its manifest before the deletion, or discards its work; in no
// case does a record or a snapshot directory come back.
func TestPublicationRacingDeletion(t *testing.T) {
	e := newEnv(t)
	type outcome int
	const (
		discarded outcome = iota
		attached
		either
	)
	type stage struct {
		name string
		want outcome
	}
	stages := []stage{
		{"before recording", discarded},
		{"after resolve", discarded},
		{"at VMM start", discarded},
		{"at first device read", discarded},
		{"before attach", discarded},
		{"racing attach", either},
		{"unsynchronised", either},
		{"after recording", attached},
	}
	const racingRounds = 6
	counts := map[string]int{}
	for _, device := range devices {
		for _, s := range stages {
			rounds := 1
			if s.want == either {
				rounds = racingRounds
			}
			if s.name == "at first device read" && device != config.DeviceFile {
				continue // the uffd device has no read hook
			}
			for range rounds {
				t.Run(device+"/"+s.name, func(t *testing.T) {
					ctx := context.Background()
					id, lease := e.publish(t)
					del := sync.OnceValue(func() error { return e.repo.Delete(ctx, id) })
					var racing sync.WaitGroup
					switch s.name {
					case "before recording":
						if err := del(); err != nil {
							t.Fatal(err)
						}
					case "after resolve":
						e.hooked.setHooks(func(string) { del() }, nil)
					case "at VMM start":
						e.vm.setBeforeStart(func() { del() })
					case "at first device read":
						e.setReadHook(func(uint64, int64, int) { del() })
					case "before attach":
						e.hooked.setHooks(nil, func(string) { del() })
					case "racing attach":
						e.hooked.setHooks(nil, func(string) { racing.Go(func() { del() }) })
					}
					job := e.recorder(device).Start(ctx, lease)
					if s.name == "unsynchronised" {
						racing.Go(func() { del() })
					}
					res, err := jobResult(t, job)
					racing.Wait()
					e.hooked.setHooks(nil, nil)
					e.vm.setBeforeStart(nil)
					e.setReadHook(nil)

					switch {
					case err == nil:
						counts["attached"]++
						if s.want == discarded {
							t.Errorf("recording attached a manifest (%+v) to a snapshot deleted %s", res.Descriptor, s.name)
						}
						if s.name == "after recording" {
							resolved, rerr := e.repo.Resolve(ctx, id)
							if rerr != nil {
								t.Fatal(rerr)
							}
							data, rerr := os.ReadFile(resolved.ManifestPath)
							if rerr != nil {
								t.Fatal(rerr)
							}
							e.checkAttached(t, id, res.Descriptor, data)
						}
					case errors.Is(err, recorder.ErrDiscarded):
						counts["discarded"]++
						if s.want == attached {
							t.Errorf("recording discarded: %v", err)
						}
					default:
						t.Errorf("recording ended with %v, want success or ErrDiscarded", err)
					}
					if err := del(); err != nil {
						t.Fatalf("delete: %v", err)
					}
					select {
					case <-lease.Done():
					default:
						t.Error("the lease is still held after the recording ended")
					}
					e.checkGone(t, id)
					for _, v := range e.hooked.takeViolations() {
						t.Errorf("after attach: %v", v)
					}
				})
			}
		}
	}
	t.Logf("outcomes: %v", counts)
}

// traceManifest is the manifest of the reference trace's distinct pages in
// first-touch order, adjacent pages coalesced: what a recording on the
// uffd device (one fault, one page) must attach.
func traceManifest(t *testing.T, e *env) *manifest.Manifest {
	t.Helper()
	offsets := make([]int64, len(e.ref.entries))
	for i, en := range e.ref.entries {
		offsets[i] = en.Offset
	}
	m, err := manifest.Build(e.ref.layout, offsets)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
