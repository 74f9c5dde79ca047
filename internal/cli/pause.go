package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/ops"
	"warmstart/internal/report"
)

// Pause is restores snapshot: it pauses the restore id names, which the
// daemon holds, into a child snapshot and prints it (as JSON with asJSON).
func (e *Env) Pause(cmd *cobra.Command, id string, req api.PauseRequest, asJSON bool) error {
	if err := ops.CheckPauseRequest(req); err != nil {
		return Error{Err: err}
	}
	return e.OnDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
		res, err := c.Pause(ctx, id, req)
		if err != nil {
			return fmt.Errorf("restores snapshot: %w", err)
		}
		if asJSON {
			if err := report.JSON(o.Out, res); err != nil {
				return err
			}
		} else {
			report.Paused(o.Out, res)
		}
		return stopFailed(res)
	})
}

// ErrStopAfterPause is a then=stop pause whose child was published and
// whose stop failed: the verb printed the child, and exits ExitStopFailed.
var ErrStopAfterPause = errors.New("the child is published, but the restore's stop failed")

// stopFailed is the verb's error when the stop that followed a published
// pause failed, nil otherwise.
func stopFailed(res api.PauseResult) error {
	if res.StopError == "" {
		return nil
	}
	return fmt.Errorf("restores snapshot: %w (child %s): %s", ErrStopAfterPause, res.Snapshot, res.StopError)
}
