package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"warmstart/internal/api"
	"warmstart/internal/ops"
	"warmstart/internal/restore"
)

// pauseRestore pauses a pausable restore into a child snapshot; with
// then=stop the restore is stopped once the child is published.
func (d *Daemon) pauseRestore(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var req api.PauseRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := ops.CheckPauseRequest(req); err != nil {
		return statusError(http.StatusBadRequest, "", err)
	}
	d.mu.Lock()
	run, ok := d.restores[id]
	d.mu.Unlock()
	if !ok {
		return statusError(http.StatusNotFound, "id", errNoRestore(id))
	}
	// A client that goes away must not leave a VM paused.
	ctx := context.WithoutCancel(r.Context())
	res, err := ops.Pause(ctx, d.repo, run.inst, req, ops.PauseOptions{StagingDir: d.cfg.Runtime.Dir, MaxDepth: int(d.cfg.Pause.MaxDepth)})
	switch {
	case errors.Is(err, restore.ErrNotPausable), errors.Is(err, restore.ErrPauseInProgress):
		return statusError(http.StatusConflict, "id", err)
	case errors.Is(err, ops.ErrPauseUnsupported):
		return statusError(http.StatusConflict, "", err)
	case err != nil:
		return err
	}
	if req.Then == api.ThenStop {
		d.mu.Lock()
		delete(d.restores, id)
		d.mu.Unlock()
		rep, err := d.stopAndRelease(ctx, run)
		if err != nil {
			return err
		}
		res.Stop = &rep
	}
	writeJSON(w, http.StatusCreated, res)
	return nil
}

func errNoRestore(id string) error { return fmt.Errorf("no restore %q", id) }
