package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"warmstart/internal/repository"
)

// ErrStalled is wrapped when the store sent a response's headers and then
// stopped sending its body: a read waited longer than the response timeout
// for the next byte.
var ErrStalled = errors.New("the store stopped sending")

// stallTransport bounds how long a read of a response body may wait for
// its next byte. The header timeout (Options.ResponseTimeout) ends a
// request the store never answers; a store that answers and then stops
// sending would otherwise hold the reader for ever (an artifact download
// has no other bound). Only the time a read is blocked counts, not the
// time between reads: a reader that is slow on purpose (the background
// fill's rate limit) is never cut off.
//
// It also keeps the requests in progress and whether each is waiting on
// the store now (unanswered): a restore given up while its memory reads
// wait says why they did not end, which a cancellation alone does not.
type stallTransport struct {
	next http.RoundTripper
	idle time.Duration

	mu      sync.Mutex
	pending map[*pendingRequest]struct{}
}

// pendingRequest is a request in progress: from RoundTrip to the close of
// its body (or a failed RoundTrip).
type pendingRequest struct {
	method, path string
	// waitingSince is when the request began waiting on the store (sent,
	// no headers yet; or a body read blocked) in Unix nanoseconds; 0
	// while it is not waiting.
	waitingSince atomic.Int64
}

func (p *pendingRequest) wait()   { p.waitingSince.Store(time.Now().UnixNano()) }
func (p *pendingRequest) answer() { p.waitingSince.Store(0) }

func (t *stallTransport) track(req *http.Request) *pendingRequest {
	p := &pendingRequest{method: req.Method, path: req.URL.Path}
	p.wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending == nil {
		t.pending = map[*pendingRequest]struct{}{}
	}
	t.pending[p] = struct{}{}
	return p
}

func (t *stallTransport) untrack(p *pendingRequest) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.pending, p)
}

// unanswered describes the requests waiting on the store now: how many,
// and the one waiting longest. It is nil when there is none.
func (t *stallTransport) unanswered() error {
	now := time.Now()
	n := 0
	var oldest *pendingRequest
	var longest time.Duration
	t.mu.Lock()
	for p := range t.pending {
		since := p.waitingSince.Load()
		if since == 0 {
			continue
		}
		n++
		if d := now.Sub(time.Unix(0, since)); oldest == nil || d > longest {
			oldest, longest = p, d
		}
	}
	t.mu.Unlock()
	if n == 0 {
		return nil
	}
	what := "1 request waiting"
	if n > 1 {
		what = fmt.Sprintf("%d requests waiting, the longest", n)
	}
	return fmt.Errorf("%w: %s %s %s for %v", ErrUnanswered, what, oldest.method, oldest.path, longest.Round(time.Millisecond))
}

// ErrUnanswered is wrapped by the report of requests the store has kept
// waiting (memorySource.Unanswered).
var ErrUnanswered = errors.New("the object store has not answered")

func (t *stallTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	p := t.track(req)
	ctx, cancel := context.WithCancelCause(req.Context())
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		t.untrack(p)
		cancel(nil)
		if req.Context().Err() == nil && noAnswer(err) {
			err = &unreachableError{err: err}
		}
		return nil, err
	}
	p.answer()
	g := &stallGuard{rc: resp.Body, idle: t.idle, ctx: ctx, cancel: cancel, t: t, p: p}
	// Armed by each read only; made here so that Close, from any
	// goroutine, finds it.
	g.timer = time.AfterFunc(t.idle, func() { cancel(ErrStalled) })
	g.timer.Stop()
	resp.Body = g
	return resp, nil
}

// stallGuard is a response body whose reads end with ErrStalled once one
// has waited idle for a byte: the request's context is cancelled, which
// aborts the read in progress.
type stallGuard struct {
	rc     io.ReadCloser
	idle   time.Duration
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	t      *stallTransport
	p      *pendingRequest
}

func (g *stallGuard) Read(p []byte) (int, error) {
	g.timer.Reset(g.idle)
	g.p.wait()
	n, err := g.rc.Read(p)
	g.p.answer()
	g.timer.Stop()
	switch {
	case err == nil || err == io.EOF:
	case errors.Is(context.Cause(g.ctx), ErrStalled):
		err = fmt.Errorf("%w: %w: no byte for %v: %w", repository.ErrUnreachable, ErrStalled, g.idle, err)
	case g.ctx.Err() == nil && noAnswer(err):
		// The connection closed or was reset before the body ended (the
		// store crashed or restarted mid-response): it stopped coming too.
		err = fmt.Errorf("%w: the response stopped before its end: %w", repository.ErrUnreachable, err)
	}
	return n, err
}

func (g *stallGuard) Close() error {
	g.timer.Stop()
	g.t.untrack(g.p)
	g.cancel(nil)
	return g.rc.Close()
}

// noAnswer reports whether err, a transport's, says the store gave no
// answer: a network error (connection refused or reset, host or network
// unreachable, a name that does not resolve, a timeout) or a connection
// closed before the response. A certificate the client refuses is not:
// waiting does not mend it.
func noAnswer(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// unreachableError is a request the store gave no answer to. It matches
// repository.ErrUnreachable and its cause with errors.Is.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string {
	cause := e.err.Error()
	if errors.Is(e.err, io.EOF) || errors.Is(e.err, io.ErrUnexpectedEOF) {
		// minio-go replaces a transport error whose text says EOF with
		// a plain one, which would lose this error and its type.
		cause = "the connection closed before the response"
	}
	return fmt.Sprintf("%v: %s", repository.ErrUnreachable, cause)
}

func (e *unreachableError) Unwrap() []error { return []error{repository.ErrUnreachable, e.err} }
