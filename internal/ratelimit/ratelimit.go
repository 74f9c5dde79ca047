// Package ratelimit holds bytes shared by concurrent streams to one rate: a
// token bucket (golang.org/x/time/rate) that its callers reach in time
// order.
package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limiter is a rate shared by concurrent callers of Wait.
//
// rate.Limiter.WaitN reads the clock before it takes the limiter's lock
// and stores that time as the bucket's last update. A caller preempted
// between the two rewinds the update to its stale time, and the next
// caller is credited the time since a second time: under contention the
// bucket grants more than its rate (golang/go#71360). A Limiter reads the
// clock under a lock of its own, so reservations reach the limiter in
// time order.
type Limiter struct {
	mu  sync.Mutex
	lim *rate.Limiter
	// clock reads the time under mu; a test stalls it.
	clock func() time.Time
}

// New returns a limiter of limit bytes per second with a bucket of burst
// bytes; rate.Inf lets everything through.
func New(limit rate.Limit, burst int) *Limiter {
	return &Limiter{lim: rate.NewLimiter(limit, burst), clock: time.Now}
}

// Set changes the rate and the bucket.
func (m *Limiter) Set(limit rate.Limit, burst int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	m.lim.SetBurstAt(now, burst)
	m.lim.SetLimitAt(now, limit)
}

// Burst is the most one Wait may ask for while the rate is finite (at
// rate.Inf any n passes).
func (m *Limiter) Burst() int { return m.lim.Burst() }

// Wait blocks until n more bytes may pass, or ctx ends. A wait that ctx
// ends gives its share back, so that a stream given up does not hold
// back the others (the hand-back, like the reservation, reaches the
// limiter under the Limiter's lock).
func (m *Limiter) Wait(ctx context.Context, n int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	now := m.clock()
	r := m.lim.ReserveN(now, n)
	m.mu.Unlock()
	if !r.OK() {
		return fmt.Errorf("pace: %d bytes at once are more than the bucket's %d", n, m.lim.Burst())
	}
	d := r.DelayFrom(now)
	if d == 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		m.mu.Lock()
		r.CancelAt(m.clock())
		m.mu.Unlock()
		return ctx.Err()
	}
}
