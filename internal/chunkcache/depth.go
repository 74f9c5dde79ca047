package chunkcache

import (
	"context"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// A warming's depth: the GETs it keeps in flight.
//
// Each GET first waits W (request to first byte: the round trip and the
// store's own latency) and then transfers its B bytes in T at the rate r
// a GET gets. A link of rate L is full only while L/r GETs transfer at
// once; a GET transfers for T out of every W+T, so the link needs
//
//	in_flight = (L/r) x (W+T)/T = L/r + L x W/B
//
// GETs in flight: the ones transferring plus the link's bandwidth-delay
// product, counted in GETs. WarmOptions.Concurrency (the base) is what a
// short round trip needs, so the depth never goes below it; only the
// waiting part grows with W. (An earlier rule, base x (1 + W/T), scaled
// the whole base with the wait, as if every one of the base's GETs had
// to keep transferring; on a full link T is the link's share, so it grew
// at round trips the base covers.)
//
// L is not known, and cannot be computed from the rates while the link
// is not full: the rate A all GETs together get is then what the depth
// gives, not what the link could carry (with n in flight, A = n x B/(W+T)
// and the formula gives back n). So each time a GET ends (from the second
// on) the warming tests whether one more GET in flight would add to A,
// and when all of these hold it raises the depth to the formula's, with
// the highest A seen for L and the highest rate one GET reached for r
// (rounded: a fraction of a GET is within the noise):
//
//   - the link is not full now: A is below 9/10 of the highest A seen,
//     which is the link's rate once the GETs have filled it (the first
//     GETs start together, so they do, unless the link is wider than the
//     base's GETs at their own rate; then the base leaves it short at any
//     round trip, and the other two tests decide);
//   - the GETs do not slow each other down: with n in flight each one
//     delivers B every W + B/r, so A is at least 85% of n x B/(W + B/r);
//     on a full link it is well below (they share it), and one more GET
//     would only share it further and slow the front of the plan, which
//     the guest wants first;
//   - the waiting is a large part of a GET's time: W >= (W+T)/3 (below
//     that the base covers the round trip).
//
// W, B and T are the means over the GETs that ended. A body's first byte
// comes with its first unit (a pack frame, decoded whole), so the wait a
// GET measures includes that unit's transfer: the unit is moved from W to
// T at the rate of the rest of the body. A is measured over the last n
// GETs' ends, about one round of every worker. The depth is capped at 4x
// the base (and MaxWarmDepth) and at the runs not started yet; it never
// shrinks (a worker ends when no run is left).

// MaxWarmDepth caps the GETs a warming adds on a long round trip.
const MaxWarmDepth = 32

// roomy is the share of the expected aggregate rate at or above which
// the GETs in flight count as not slowing each other, and fullLink the
// share of the highest aggregate rate at or above which the link counts
// as full: a few per cent of noise, and the bytes of a body arrive in
// units (a pack frame), not evenly.
const (
	roomy    = 0.85
	fullLink = 0.9
)

// depthMeter measures a warming's GETs and says when to add workers.
type depthMeter struct {
	// received counts the bytes all of the warming's GETs have read.
	received atomic.Int64

	mu          sync.Mutex
	base, limit int
	workers     int
	// ends are the received count at each GET's end, oldest first, from
	// the first byte of the first GET on.
	ends              []mark
	waitSum, transSum float64 // seconds
	bytesSum          int64
	// getRate and linkRate are the highest r and A seen, bytes a second.
	getRate, linkRate float64
}

// mark is the warming's received count at a moment.
type mark struct {
	at       time.Time
	received int64
}

func newDepthMeter(base, runs int) *depthMeter {
	limit := min(4*base, MaxWarmDepth, runs)
	return &depthMeter{base: base, limit: max(limit, base), workers: min(base, runs)}
}

// getSample is what one GET's body tells: when it was asked for, when its
// first byte came, the warming's received count then, and its bytes.
type getSample struct {
	start, first, end time.Time
	// firstBytes came with the first byte (a whole unit of the body);
	// bytes counts them and the rest.
	firstBytes, bytes int64
}

// metered wraps fetch so that the GET's body fills s.
func (d *depthMeter) metered(fetch FetchFunc, s *getSample) FetchFunc {
	return func(ctx context.Context, off, length int64) (io.ReadCloser, error) {
		s.start = time.Now()
		body, err := fetch(ctx, off, length)
		if err != nil {
			return nil, err
		}
		return &meteredBody{ReadCloser: body, s: s, received: &d.received}, nil
	}
}

// meteredBody records a GET's first byte and counts its bytes; it keeps
// the UnitReader of the body it wraps.
type meteredBody struct {
	io.ReadCloser
	s        *getSample
	received *atomic.Int64
}

func (b *meteredBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		if b.s.first.IsZero() {
			b.s.first = time.Now()
			b.s.firstBytes = int64(n)
		}
		b.s.bytes += int64(n)
		b.received.Add(int64(n))
	}
	return n, err
}

// UnitBytes passes on the wrapped body's unit (flight.go's stepOf).
func (b *meteredBody) UnitBytes() int {
	if u, ok := b.ReadCloser.(UnitReader); ok {
		return u.UnitBytes()
	}
	return 0
}

// ended records a GET that ended (s.end), having read all it asked for,
// and returns how many workers to add, given the runs not started yet.
func (d *depthMeter) ended(s *getSample, runsLeft int) int {
	t := s.end.Sub(s.first).Seconds()
	if s.first.IsZero() || t <= 0 || s.bytes <= s.firstBytes {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	rate := float64(s.bytes-s.firstBytes) / t
	unit := float64(s.firstBytes) / rate // the first unit's transfer
	d.waitSum += max(0, s.first.Sub(s.start).Seconds()-unit)
	d.transSum += t + unit
	d.bytesSum += s.bytes
	if len(d.ends) == 0 {
		d.ends = append(d.ends, mark{s.first, 0})
	}
	d.ends = append(d.ends, mark{s.end, d.received.Load()})
	from := d.ends[max(0, len(d.ends)-1-d.workers)]
	last := d.ends[len(d.ends)-1]
	aggregate := float64(last.received-from.received) / last.at.Sub(from.at).Seconds()
	d.linkRate = max(d.linkRate, aggregate)
	// A body the decoder fell behind on comes out of the socket's buffers
	// faster than the link: no GET is faster than all of them together.
	d.getRate = max(d.getRate, min(rate, d.linkRate))
	if len(d.ends) < 3 || runsLeft <= 0 {
		return 0
	}
	add := min(d.want(aggregate), d.limit) - d.workers
	add = min(add, runsLeft)
	if add <= 0 {
		return 0
	}
	d.workers += add
	return add
}

// want is the depth the link needs, L/r + L x W/B rounded, when the
// aggregate rate now says one more GET in flight would add to it; else 0
// (see the derivation above).
func (d *depthMeter) want(aggregate float64) int {
	n := float64(len(d.ends) - 1)
	w, t, b := d.waitSum/n, d.transSum/n, float64(d.bytesSum)/n
	expected := float64(d.workers) * b / (w + b/d.getRate)
	if aggregate >= fullLink*d.linkRate || aggregate < roomy*expected || w < (w+t)/3 {
		return 0
	}
	return int(math.Round(d.linkRate/d.getRate + d.linkRate*w/b))
}

// depth is the workers the warming has had at most.
func (d *depthMeter) depth() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.workers
}
