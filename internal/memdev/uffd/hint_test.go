package uffd

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/prefetch"
	"warmstart/internal/vmm"
)

// gatedLower is a local lower file whose first advice waits, as on a cold
// store, until the channel sent on gate closes. It counts the advices,
// those in progress, and those after it was closed.
type gatedLower struct {
	*os.File
	size                     int64
	gate                     chan (<-chan struct{})
	entered                  chan struct{}
	calls, inAdvice, onClose atomic.Int64
	closed                   atomic.Bool
}

func (l *gatedLower) Size() int64 { return l.size }

func (l *gatedLower) Close() error {
	l.closed.Store(true)
	return l.File.Close()
}

func (l *gatedLower) Advise(off, length int64) error {
	l.inAdvice.Add(1)
	defer l.inAdvice.Add(-1)
	if l.closed.Load() {
		l.onClose.Add(1)
	}
	if l.calls.Add(1) == 1 {
		close(l.entered)
		<-<-l.gate
	}
	return nil
}

type gatedSource struct{ l *gatedLower }

func (s gatedSource) Ref() string                 { return "gated-1" }
func (s gatedSource) Open() (memdev.Lower, error) { return s.l, nil }

// newGatedLower is a lower file in a fresh directory whose first advice
// waits on the channel its gate is given.
func newGatedLower(t *testing.T) (*gatedLower, string) {
	dir, err := os.MkdirTemp("", "uffd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path, _ := newLowerFile(t, dir, lowerBytes)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return &gatedLower{File: f, size: lowerBytes, gate: make(chan (<-chan struct{}), 1), entered: make(chan struct{})}, dir
}

// gatedDevice opens a device on lower, with a VMM connected to it.
func gatedDevice(t *testing.T, lower *gatedLower, dir string) (*Device, *childVMM) {
	dev, err := NewOpener(0).Open(memdev.Request{Memory: gatedSource{lower}, RunDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	d := dev.(*Device)
	var spec vmm.RestoreSpec
	if err := d.Configure(context.Background(), &spec); err != nil {
		t.Fatal(err)
	}
	v := startVMM(t, spec.MemPath, twoRegions)
	await(t, (<-chan struct{})(d.accepted), "accept")
	return d, v
}

// TestReleaseStopsTheStorageHint: a VM stopped while its device still
// hints a plan of thousands of ranges to a cold lower. The release ends
// the hint, waits for the advice in progress, and only then closes the
// lower: no hint outlives the device, and none advises a closed lower.
func TestReleaseStopsTheStorageHint(t *testing.T) {
	lower, dir := newGatedLower(t)
	d, v := gatedDevice(t, lower, dir)
	var plan []prefetch.Range
	for off := int64(lowerBytes) - 4096; off >= 0; off -= 4096 {
		plan = append(plan, prefetch.Range{Offset: off, Length: 4096})
	}
	if _, _, err := d.Target(plan, memdev.TargetOptions{Hint: true}); err != nil {
		t.Fatal(err)
	}
	d.hintMu.Lock()
	lower.gate <- d.hints[0].Stopping() // the advice in progress ends when the release begins
	d.hintMu.Unlock()
	await(t, (<-chan struct{})(lower.entered), "the first advice")
	v.kill() // the stop order: the VM stops first
	released := make(chan error, 1)
	go func() {
		_, err := d.Release(context.Background())
		released <- err
	}()
	if err := await(t, released, "release"); err != nil {
		t.Errorf("release: %v", err)
	}
	n, busy, late := lower.calls.Load(), lower.inAdvice.Load(), lower.onClose.Load()
	if n != 1 || busy != 0 || late != 0 {
		t.Fatalf("release during the first advice of %d: %d advices, %d in progress after it, %d on the closed lower;"+
			" want 1, 0, 0", len(plan), n, busy, late)
	}
}

// TestReleaseIsBoundedWhileAnAdviceHangs: an advice stuck on storage that
// stopped answering holds the release no longer than a stuck read would
// (closeWait); it ends by itself when the storage answers.
func TestReleaseIsBoundedWhileAnAdviceHangs(t *testing.T) {
	lower, dir := newGatedLower(t)
	answered := make(chan struct{})
	lower.gate <- answered // the storage answers only at the end of the test
	t.Cleanup(func() { close(answered) })
	d, v := gatedDevice(t, lower, dir)
	if _, _, err := d.Target([]prefetch.Range{{Offset: 0, Length: 4096}}, memdev.TargetOptions{Hint: true}); err != nil {
		t.Fatal(err)
	}
	await(t, (<-chan struct{})(lower.entered), "the advice")
	v.kill()
	closeWait = 200 * time.Millisecond
	t.Cleanup(func() { closeWait = defaultCloseWait })
	released := make(chan error, 1)
	go func() {
		_, err := d.Release(context.Background())
		released <- err
	}()
	select {
	case <-released:
	case <-time.After(guardTimeout):
		t.Fatalf("release still waiting %v after the advice hung: it waits for the storage", guardTimeout)
	}
}
