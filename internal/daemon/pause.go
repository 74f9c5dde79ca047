package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/ops"
	"warmstart/internal/pause"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// A pause and a stop of one restore are ordered here, by the restore's
// pauseGate under d.mu. The daemon, not restore.Instance, owns this: a
// restore's life in the daemon (listed, pausing, taken out to be stopped)
// is the daemon's, and a pause outlives the instance's frozen window (with
// then=resume the VM runs again before the child is built and published,
// and a second Freeze then would make a child of the old parent without
// the first pause's pages). d.mu is held only to read or flip the gate;
// the waiting is on the restore's own channel, so restores never wait for
// each other.

// pauseGate is the pause in progress of one restore, guarded by d.mu.
type pauseGate struct {
	// done is closed when the pause ends; nil when none runs.
	done chan struct{}
	// cancel ends the pause's context: a stop that waited too long, or
	// the shutdown once its grace is over.
	cancel context.CancelCauseFunc
}

// errRestoreStopping is the cause a stop cancels a pause with.
var errRestoreStopping = errors.New("the restore is being stopped")

// pauseCancelGrace is how long a stop waits for a pause it cancelled to
// return before it stops the VM under it (the publish is atomic: the
// child is then either whole or absent).
const pauseCancelGrace = 10 * time.Second

const msgStopWaitsForPause = "stop waits for the pause in progress"

// pauseRestore pauses a pausable restore into a child snapshot; with
// then=stop the restore is stopped once the child is published.
func (d *Daemon) pauseRestore(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var req api.PauseRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := ops.CheckPauseRequest(req); err != nil {
		return fieldError(err)
	}
	run, ctx, err := d.beginPause(r.Context(), id)
	if err != nil {
		return err
	}
	out, ok := d.runPause(ctx, run, req)
	if !ok {
		// Cancelled by the shutdown and still running (a clean-up the
		// store does not answer): the client gets its answer now, the
		// shutdown stops the VM under the pause (awaitPause).
		d.log.Warn("shutdown: the cancelled pause still runs; answering without it", "restore", id)
		return shuttingDown(fmt.Errorf("pause of restore %s cancelled; it had not ended (list the snapshots for its child)", id))
	}
	res, err, owned := out.res, out.err, out.owned
	if err != nil {
		return pauseFailed(err, out.cause)
	}
	if owned {
		// A client that goes away must not leave a stop half done.
		rep, err := d.stopAndRelease(context.WithoutCancel(r.Context()), run)
		res.Stop = &rep
		if err != nil {
			// The child is published whole: answer it, or a client
			// that believes the pause failed pauses again.
			d.log.Error("the stop after a published pause failed", "restore", id, "child", res.Snapshot, "err", err)
			res.StopError = err.Error()
		}
	}
	// Not owned with then=stop: a stop that waited for this pause has the
	// restore and stops the VM the pause left paused.
	writeJSON(w, http.StatusCreated, res)
	return nil
}

// pauseOutcome is how a pause run by runPause ended.
type pauseOutcome struct {
	res   api.PauseResult
	err   error
	cause error // the pause context's cause
	owned bool  // endPause took the restore for the caller to stop
}

// pauseAnswerTime is how long a pause cancelled by the shutdown has to
// return before its client is answered without it: well within
// cancelledAnswerTime, after which the connections are closed.
const pauseAnswerTime = cancelledAnswerTime / 2

// runPause runs the pause of run on its own goroutine, which ends it
// (endPause) whenever it returns, and waits for it. It reports false
// when the shutdown cancelled the pause and it did not return within
// pauseAnswerTime.
func (d *Daemon) runPause(ctx context.Context, run *running, req api.PauseRequest) (pauseOutcome, bool) {
	done := make(chan pauseOutcome, 1)
	go func() {
		res, err := ops.Pause(ctx, d.repo, run.inst, req, d.pauseOptions(ctx, run.info.ID))
		cause := context.Cause(ctx)
		owned := d.endPause(run, err == nil && req.Then == api.ThenStop)
		done <- pauseOutcome{res: res, err: err, cause: cause, owned: owned}
	}()
	select {
	case out := <-done:
		return out, true
	case <-ctx.Done():
	}
	if !errors.Is(context.Cause(ctx), ErrShuttingDown) {
		// A stop cancelled it: the stop waits for it, and so does this.
		return <-done, true
	}
	t := time.NewTimer(pauseAnswerTime)
	defer t.Stop()
	select {
	case out := <-done:
		return out, true
	case <-t.C:
		return pauseOutcome{}, false
	}
}

// pauseFailed is the answer to a failed pause; cause is its context's.
func pauseFailed(err, cause error) error {
	switch {
	case errors.Is(cause, ErrShuttingDown):
		return shuttingDown(err)
	case errors.Is(cause, errRestoreStopping):
		return statusError(http.StatusConflict, "id", fmt.Errorf("%w: %w", cause, err))
	case errors.Is(err, restore.ErrNotPausable), errors.Is(err, restore.ErrPauseInProgress),
		errors.Is(err, restore.ErrPagesLost), errors.Is(err, restore.ErrVMExited):
		return statusError(http.StatusConflict, "id", err)
	case errors.Is(err, ops.ErrPauseUnsupported):
		return statusError(http.StatusConflict, "", err)
	case errors.Is(err, repository.ErrAliasConflict):
		return statusError(http.StatusConflict, "alias", err)
	case errors.Is(err, repository.ErrNotFound), errors.Is(err, repository.ErrStale):
		// The snapshot the restore was restored from (or an ancestor
		// whose layer it reads) was deleted, or flattened meanwhile (a
		// pause again builds over its new memory).
		return statusError(http.StatusConflict, "id", err)
	}
	return err
}

// beginPause takes restore id's pause gate: 404 when it is not listed
// (never was, or a stop took it), 409 while another pause of it runs, 503
// once shutdown has begun. The pause's context outlives its client (a
// client that goes away must not leave a VM paused) but ends with the
// shutdown grace or a stop that gave up waiting.
func (d *Daemon) beginPause(parent context.Context, id string) (*running, context.Context, error) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	d.mu.Lock()
	defer d.mu.Unlock()
	run, ok := d.restores[id]
	switch {
	case d.closing:
		cancel(nil)
		return nil, nil, shuttingDown(nil)
	case !ok:
		cancel(nil)
		return nil, nil, statusError(http.StatusNotFound, "id", errNoRestore(id))
	case run.pause.done != nil:
		cancel(nil)
		return nil, nil, statusError(http.StatusConflict, "id", fmt.Errorf("restore %s: %w", id, restore.ErrPauseInProgress))
	}
	unhook := context.AfterFunc(d.reqCtx, func() { cancel(ErrShuttingDown) })
	run.pause = pauseGate{done: make(chan struct{}), cancel: func(cause error) {
		unhook()
		cancel(cause)
	}}
	return run, ctx, nil
}

// endPause releases run's pause gate, waking a stop that waits for it.
// With takeForStop (a published then=stop pause) it takes run out of the
// listed restores for the caller to stop, and reports whether it did: a
// stop that took run first stops it itself.
func (d *Daemon) endPause(run *running, takeForStop bool) (owned bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := run.pause
	run.pause = pauseGate{}
	g.cancel(nil)
	close(g.done)
	id := run.info.ID
	if !takeForStop || d.restores[id] != run {
		return false
	}
	delete(d.restores, id)
	return true
}

// awaitPause waits, before a stop of run (already taken out of the listed
// restores, so no pause of it can begin), for its pause in progress to
// end: within the stop timeout or ctx, after which it cancels the pause
// and waits pauseCancelGrace more. In a shutdown, which cancelled the
// pause at its grace, it waits shutdownPauseWait only. A pause cancelled
// before its record is written publishes nothing and resumes the VM; the
// stop follows.
func (d *Daemon) awaitPause(ctx context.Context, run *running) {
	d.mu.Lock()
	g := run.pause
	d.mu.Unlock()
	if g.done == nil {
		return
	}
	id := run.info.ID
	d.log.Info(msgStopWaitsForPause, "restore", id)
	t0 := time.Now()
	// In a shutdown the pause was cancelled at the grace already.
	first, then := d.stopWithin, pauseCancelGrace
	if d.reqCtx.Err() != nil {
		first, then = 0, shutdownPauseWait
	}
	t := time.NewTimer(first)
	defer t.Stop()
	select {
	case <-g.done:
		return
	case <-t.C:
	case <-ctx.Done():
	}
	d.log.Warn("stop: the pause did not end in time; cancelling it", "restore", id, "waited", time.Since(t0))
	g.cancel(fmt.Errorf("restore %s: %w", id, errRestoreStopping))
	t.Reset(then)
	select {
	case <-g.done:
	case <-t.C:
		d.log.Error("stop: the cancelled pause still runs; stopping the VM under it", "restore", id)
	}
}

// pauseOptions are a pause's options on this daemon: staging in the
// runtime directory, [pause] max_depth, and the tests' step hook.
func (d *Daemon) pauseOptions(ctx context.Context, id string) ops.PauseOptions {
	opts := ops.PauseOptions{StagingDir: d.cfg.Runtime.Dir, MaxDepth: int(d.cfg.Pause.MaxDepth)}
	if hook := testHookPauseStep; hook != nil {
		opts.OnStep = func(step string) { hook(ctx, id, step) }
	}
	return opts
}

// testHookPauseStep, set by tests, is told of each step of a pause with
// the pause's context, before the step starts.
var testHookPauseStep func(ctx context.Context, id, step string)

// sweepPauseStaging removes the staging directories of pauses a daemon
// that died left in dir (VM state and changed pages, as large as the
// guest's writes). Only a daemon stages pauses there, and this one holds
// dir's lock: every such directory is a dead daemon's. Failures are
// logged: they do not stop the daemon.
func sweepPauseStaging(dir string, log *slog.Logger) {
	left, err := filepath.Glob(filepath.Join(dir, pause.StagingPrefix+"*"))
	if err != nil {
		return
	}
	for _, p := range left {
		if err := os.RemoveAll(p); err != nil {
			log.Warn("remove a dead daemon's pause staging", "dir", p, "error", err)
			continue
		}
		log.Info("removed a dead daemon's pause staging", "dir", p)
	}
}

func errNoRestore(id string) error { return fmt.Errorf("no restore %q", id) }
