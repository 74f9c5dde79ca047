package cli

import (
	"context"
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
			return report.JSON(o.Out, res)
		}
		report.Paused(o.Out, res)
		return nil
	})
}
