package ratelimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// Callers waiting at once never get more than the rate, even when some of
// them stall between reading the clock and taking their share (a thread
// the host preempts: on a loaded CI node the benchmark's link once let
// four connections through 15 ms faster than its rate). The stalls add
// up to 24 ms, well under the 196 ms floor, so a meter that let callers
// through early would show. With the clock read outside the lock, as
// rate.Limiter.WaitN reads it, 24 MiB passed in 84 ms (3 ms stalls).
func TestLimiterHoldsItsRateWhenACallerStalls(t *testing.T) {
	const (
		bytesPerSec = 125_000_000
		burst       = 625_000
		slice       = 16 << 10
		callers     = 8
		total       = 24 << 20
		stallEvery  = 64
		stall       = time.Millisecond
	)
	m := New(bytesPerSec, burst)
	var reads atomic.Int64
	m.clock = func() time.Time {
		now := time.Now()
		if reads.Add(1)%stallEvery == 0 {
			time.Sleep(stall) // the stall under test, not a wait for anything
		}
		return now
	}
	var (
		granted atomic.Int64
		wg      sync.WaitGroup
	)
	start := time.Now()
	for range callers {
		wg.Go(func() {
			for granted.Add(slice) <= total {
				if err := m.Wait(context.Background(), slice); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	floor := time.Duration(float64(total-burst) / bytesPerSec * float64(time.Second))
	t.Logf("%d callers, %d MiB, every %dth clock read stalled %v: %v (floor %v)", callers, total>>20, stallEvery, stall, took, floor)
	if took < floor {
		t.Errorf("%d bytes were granted in %v: faster than %d bytes/s allows (at least %v)", total, took, bytesPerSec, floor)
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	m := New(1000, 1000)
	if err := m.Wait(context.Background(), 1000); err != nil {
		t.Fatal(err) // the full bucket
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Wait(ctx, 1000) }() // a second's wait
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait returned %v, want context.Canceled", err)
	}
}

func TestWaitRefusesMoreThanTheBucket(t *testing.T) {
	m := New(1000, 10)
	if err := m.Wait(context.Background(), 11); err == nil {
		t.Fatal("a wait for more than the bucket holds was granted")
	}
}

func TestInfiniteRateLetsEverythingThrough(t *testing.T) {
	m := New(rate.Inf, 1)
	m.Set(rate.Inf, 1)
	if err := m.Wait(context.Background(), 1<<30); err != nil {
		t.Fatal(err)
	}
	// From no limit to a rate (as the benchmark's link is set up): the
	// bucket's 1,000 bytes pass at once, the next 1,000 a millisecond
	// later.
	m.Set(1_000_000, 1000)
	if got := m.Burst(); got != 1000 {
		t.Fatalf("Burst() = %d after Set, want 1000", got)
	}
	start := time.Now()
	for range 2 {
		if err := m.Wait(context.Background(), 1000); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took < time.Millisecond-50*time.Microsecond {
		t.Fatalf("2,000 bytes through a 1,000-byte bucket at 1 MB/s took %v, want about 1 ms", took)
	}
}

// A wait its context ends gives its share back: the next caller does not
// wait for bytes nobody sent.
func TestCancelledWaitGivesItsShareBack(t *testing.T) {
	m := New(1000, 1000)
	if err := m.Wait(context.Background(), 1000); err != nil {
		t.Fatal(err) // the full bucket
	}
	// The next clock read is the second wait's, under the lock its
	// reservation is made in; its cancellation takes the same lock, so
	// it comes after the reservation.
	reading := make(chan struct{})
	var once sync.Once
	m.clock = func() time.Time {
		once.Do(func() { close(reading) })
		return time.Now()
	}
	ctx, cancel := context.WithCancel(context.Background())
	waiting := make(chan error, 1)
	go func() { waiting <- m.Wait(ctx, 1000) }() // would be granted in 1 s
	<-reading
	cancel()
	if err := <-waiting; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait returned %v", err)
	}
	if tokens := m.lim.TokensAt(time.Now()); tokens < -100 {
		t.Fatalf("the bucket holds %.0f tokens after the cancelled wait, want its 1,000 back (about 0)", tokens)
	}
}
