package pace

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// Callers waiting at once never get more than the rate, even when one of
// them stalls between reading the clock and taking its share (a thread
// the host preempts: on a loaded CI node the benchmark's link once let
// four connections through 15 ms faster than its rate). With the clock
// read outside the lock, as rate.Limiter.WaitN reads it, the same 24 MiB
// passed in 84 ms of a 196 ms floor.
func TestMeterHoldsItsRateWhenACallerStalls(t *testing.T) {
	const (
		bytesPerSec = 125_000_000
		burst       = 625_000
		slice       = 16 << 10
		callers     = 8
		total       = 24 << 20
		stallEvery  = 8
		stall       = 3 * time.Millisecond
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
	m.Set(1000, 500)
	if got := m.Burst(); got != 500 {
		t.Fatalf("Burst() = %d after Set, want 500", got)
	}
}
