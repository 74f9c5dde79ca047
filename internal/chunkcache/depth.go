package chunkcache

import (
	"context"
	"io"
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
// waiting part grows with W.
//
// L is not known, and cannot be measured while the link is not full: the
// rate all GETs together get is then what the depth gives, not what the
// link could carry. What can be measured is whether the GETs slow each
// other down. With n in flight that do not, each one delivers B every
// W + B/r, r being the rate one GET reaches on its own (the highest seen),
// so together they deliver
//
//	expected = n x B / (W + B/r).
//
// An aggregate rate A close to that says the link carried all of them at
// their own rate: it has room, and one more GET in flight adds B/(W+B/r)
// to A. An A well below it says they shared a full link, where one more
// GET only shares it further and slows the front of the plan, which the
// guest wants first. So, each time a GET ends (from the second on), the
// warming adds one worker while A >= 85% of expected and the wait is at
// least a third of a GET's time (W >= (W+T)/3; below that the base
// covers it). W, B and T are the means over the GETs that ended; A is
// measured over the last n GETs' ends, about one round of every worker.
// The depth is capped at 4x the base (and MaxWarmDepth) and at the runs
// not started yet; it never shrinks (a worker ends when no run is left).

// MaxWarmDepth caps the GETs a warming adds on a long round trip.
const MaxWarmDepth = 32

// roomy is the share of the expected aggregate rate at or above which
// the GETs in flight count as not slowing each other: a few per cent of
// noise, and the bytes of a body arrive in units (a pack frame), not
// evenly.
const roomy = 0.85

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
	waitSum, transSum time.Duration
	bytesSum          int64
	getRate           float64 // bytes per second: the highest r seen
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
	start, first time.Time
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

// ended records a GET that ended at end, having read all it asked for,
// and returns how many workers to add (0 or 1), given the runs not
// started yet.
func (d *depthMeter) ended(s *getSample, end time.Time, runsLeft int) int {
	t := end.Sub(s.first)
	if s.first.IsZero() || t <= 0 || s.bytes <= 0 {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.ends) == 0 {
		d.ends = append(d.ends, mark{s.first, 0})
	}
	d.ends = append(d.ends, mark{end, d.received.Load()})
	d.waitSum += s.first.Sub(s.start)
	d.transSum += t
	d.bytesSum += s.bytes
	// The first unit came in at the first byte, so the rate is the rest's.
	d.getRate = max(d.getRate, float64(s.bytes-s.firstBytes)/t.Seconds())
	n := len(d.ends) - 1 // GETs ended
	if n < 2 || d.workers >= d.limit || runsLeft <= 0 || d.getRate <= 0 {
		return 0
	}
	w, tr := d.waitSum.Seconds()/float64(n), d.transSum.Seconds()/float64(n)
	if w < (w+tr)/3 {
		return 0
	}
	b := float64(d.bytesSum) / float64(n)
	expected := float64(d.workers) * b / (w + b/d.getRate)
	from := d.ends[max(0, len(d.ends)-1-d.workers)]
	last := d.ends[len(d.ends)-1]
	aggregate := float64(last.received-from.received) / last.at.Sub(from.at).Seconds()
	if aggregate < roomy*expected {
		return 0
	}
	d.workers++
	return 1
}

// depth is the workers the warming has had at most.
func (d *depthMeter) depth() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.workers
}
