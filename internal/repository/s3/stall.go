package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
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
type stallTransport struct {
	next http.RoundTripper
	idle time.Duration
}

func (t *stallTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	resp, err := t.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel(nil)
		return nil, err
	}
	g := &stallGuard{rc: resp.Body, idle: t.idle, ctx: ctx, cancel: cancel}
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
}

func (g *stallGuard) Read(p []byte) (int, error) {
	g.timer.Reset(g.idle)
	n, err := g.rc.Read(p)
	g.timer.Stop()
	if err != nil && errors.Is(context.Cause(g.ctx), ErrStalled) {
		err = fmt.Errorf("%w: no byte for %v: %w", ErrStalled, g.idle, err)
	}
	return n, err
}

func (g *stallGuard) Close() error {
	g.timer.Stop()
	g.cancel(nil)
	return g.rc.Close()
}
