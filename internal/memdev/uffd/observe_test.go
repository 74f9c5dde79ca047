package uffd

import (
	"context"
	"sync"
	"testing"
	"time"

	"warmstart/internal/memdev"
	"warmstart/internal/userfaultfd"
)

// heldObserver holds the first prefetch it hears of, inside Served, until
// proceed closes: as a restore's timeline would be, were the installing
// goroutine preempted there.
type heldObserver struct {
	heard, proceed chan struct{}
	once           sync.Once
}

func (o *heldObserver) Served(kind memdev.Kind, off int64, n int, took time.Duration) {
	if kind == memdev.Prefetch {
		o.once.Do(func() {
			close(o.heard)
			<-o.proceed
		})
	}
}

// TestInstallIsHeardOfBeforeTheGuestCanFindIt: a guest that touches a page
// while the session has not yet told its observer of the install that
// brings it in must find the page missing, and fault. Were the page
// already in place, the guest could touch it (no fault) and reach ready
// before the prefetch was recorded, and the restore's accounting, cut at
// ready, would count a page the guest used as neither prefetched nor
// requested: unused.
func TestInstallIsHeardOfBeforeTheGuestCanFindIt(t *testing.T) {
	base := int64(2 << 20)
	obs := &heldObserver{heard: make(chan struct{}), proceed: make(chan struct{})}
	f := newFixture(t, Options{Observer: obs})
	installed := make(chan error, 1)
	go func() { installed <- f.s.Install(context.Background(), base, 16*userfaultfd.PageSizeBytes) }()
	proceed := sync.OnceFunc(func() { close(obs.proceed) })
	defer proceed()
	await(t, (<-chan struct{})(obs.heard), "the install's prefetch event")
	f.touchAndCheck(reads(base + 3*userfaultfd.PageSizeBytes)...)
	if st := f.s.Stats(); st.Faults != 1 {
		t.Errorf("the guest's touch of a page being installed took %d faults, want 1: it found the page in place"+
			" before the install was heard of", st.Faults)
	}
	proceed()
	if err := await(t, installed, "install"); err != nil {
		t.Fatalf("install: %v", err)
	}
}
