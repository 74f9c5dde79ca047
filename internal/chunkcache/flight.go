package chunkcache

import (
	"context"
	"io"
	"sync"
)

// progressBytes is the step in which a block's bytes reach readers waiting
// on its fetch. A block of a startup pack arrives as frames that its fetch
// function has already checked, several to a block; a guest faulting on
// the first page of a block wants that page as soon as its frame is in,
// not once the whole block is (at a quarter of a 1 Gbit/s link a 1 MiB
// block takes 33 ms, a 64 KiB step 2 ms).
const progressBytes = 64 << 10

// flight is a fetch in progress of one block. Readers waiting on it may
// take the block's leading bytes as they arrive (wait): a FetchFunc yields
// only bytes it has checked (a chunk or a pack frame against its digest),
// so a prefix is as good as the whole block. The block is cached only
// once complete.
type flight struct {
	// job is the fetch the flight is part of; readers joining the flight
	// hold it (job.go).
	job  *fetchJob
	done chan struct{}
	data []byte // set before done closes, on success
	err  error  // set before done closes, on failure

	mu    sync.Mutex
	buf   []byte        // the block being received
	avail int64         // how many leading bytes of buf are in
	more  chan struct{} // closed, and replaced, when avail grows
}

func newFlight(job *fetchJob) *flight {
	return &flight{job: job, done: make(chan struct{}), more: make(chan struct{})}
}

// UnitReader is a fetch body that yields its bytes in units it checks
// whole (a startup pack's frames): a Read of a whole unit, at a unit's
// start, takes the unit straight into the reader's buffer with no copy in
// between. A flight then receives its block in the body's units rather
// than in progressBytes steps.
type UnitReader interface {
	io.Reader
	// UnitBytes is the length of the body's units.
	UnitBytes() int
}

// stepOf is the step in which a flight receives from body.
func stepOf(body io.Reader) int {
	if u, ok := body.(UnitReader); ok && u.UnitBytes() > 0 {
		return u.UnitBytes()
	}
	return progressBytes
}

// receive reads the block from body into buf in steps, letting waiting
// readers at each step's bytes as it completes.
func (f *flight) receive(body io.Reader, buf []byte) error {
	f.mu.Lock()
	f.buf = buf
	f.mu.Unlock()
	step := stepOf(body)
	for got := 0; got < len(buf); {
		n, err := io.ReadFull(body, buf[got:min(got+step, len(buf))])
		got += n
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.avail = int64(got)
		close(f.more)
		f.more = make(chan struct{})
		f.mu.Unlock()
	}
	return nil
}

// wait returns the block's bytes once its first end bytes are in (a
// prefix of the block, or all of it), or the fetch's error.
func (f *flight) wait(ctx context.Context, end int64) ([]byte, error) {
	for {
		f.mu.Lock()
		buf, avail, more := f.buf, f.avail, f.more
		f.mu.Unlock()
		if avail >= end {
			return buf[:avail], nil
		}
		select {
		case <-f.done:
			if f.err != nil {
				return nil, f.err
			}
			return f.data, nil
		case <-more:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}
