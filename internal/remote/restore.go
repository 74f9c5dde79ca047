package remote

import (
	"context"
	"fmt"

	"warmstart/internal/api"
	"warmstart/internal/report"
)

// Restore restores on the daemon and prints what restore prints in
// process. With hold the daemon keeps the VM and Restore returns, naming
// the command that stops it (socket is the daemon's address); without, it
// stops the VM after printing.
func Restore(ctx context.Context, c *api.Client, o report.Output, req api.RestoreRequest, socket string, hold, asJSON bool) error {
	in, err := c.Restore(ctx, req)
	if err != nil {
		return fmt.Errorf("restore %s: %w", req.Snapshot, err)
	}
	if err := report.RestoreResult(o.Out, in, asJSON); err != nil {
		return err
	}
	if hold {
		fmt.Fprintf(o.Err, "the daemon holds restore %s; stop it with: warmstart --daemon %s restores stop %s\n", in.ID, socket, in.ID)
		return nil
	}
	// Stopped even when ctx ended since the answer (the verb was
	// interrupted): nothing else would stop this restore, which the
	// caller does not hold. The daemon bounds the stop.
	rep, err := c.StopRestore(context.WithoutCancel(ctx), in.ID)
	if err != nil {
		return fmt.Errorf("restore %s: stop: %w", req.Snapshot, err)
	}
	if !asJSON {
		report.Stopped(o.Out, rep.StopReport)
	}
	if rep.Exit != nil {
		return fmt.Errorf("restore %s: the VM exited after ready: %v", in.ID, rep.Exit)
	}
	return nil
}

// Restores prints the restores the daemon holds, oldest first.
func Restores(ctx context.Context, c *api.Client, o report.Output, asJSON bool) error {
	infos, err := c.Restores(ctx)
	if err != nil {
		return fmt.Errorf("restores list: %w", err)
	}
	if asJSON {
		return report.JSON(o.Out, infos)
	}
	return report.Restores(o.Out, infos)
}

// StopRestore stops a restore the daemon holds and prints how it stopped.
func StopRestore(ctx context.Context, c *api.Client, o report.Output, id string) error {
	rep, err := c.StopRestore(ctx, id)
	if err != nil {
		return fmt.Errorf("restores stop: %w", err)
	}
	report.Stopped(o.Out, rep.StopReport)
	return nil
}
