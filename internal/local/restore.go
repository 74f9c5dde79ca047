package local

import (
	"context"
	"fmt"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/chart"
	"warmstart/internal/node"
	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/restore"
)

// RestoreRequest is what an in-process restore does.
type RestoreRequest struct {
	Ref     string
	Options restore.Options
	// Hold keeps the VM until ctx ends or the VM exits on its own.
	Hold bool
	JSON bool
	// Plot, when set, is where the restore's timeline is drawn.
	Plot string
}

// Restore restores in this process, prints the restore as the daemon
// describes it, holds it if asked, and stops it in order. A VM that exited
// after ready fails the restore once everything is released.
func Restore(ctx context.Context, n *node.Node, o report.Output, req RestoreRequest) error {
	inst, info, err := ops.Restore(ctx, n, req.Ref, req.Options)
	if err != nil {
		return err
	}
	if err := printRestore(o, inst, info, req); err != nil {
		inst.Stop(context.Background())
		return err
	}
	if req.Hold {
		fmt.Fprintln(o.Err, "holding the VM; Ctrl-C stops it")
		holdUntilStopOrExit(ctx, inst)
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := inst.StopReported(sctx)
	if err != nil {
		return err
	}
	if !req.JSON {
		report.Stopped(o.Out, rep)
	}
	if rep.Exit != nil {
		// Everything is released; the VM's end is still a failure.
		return fmt.Errorf("restore %s: the VM exited after ready: %v", info.Snapshot, rep.Exit)
	}
	return nil
}

// printRestore prints a ready restore, as JSON or for people, and draws
// its timeline when asked.
func printRestore(o report.Output, inst *restore.Instance, in api.RestoreInfo, req RestoreRequest) error {
	if err := report.RestoreResult(o.Out, in, req.JSON); err != nil || req.Plot == "" {
		return err
	}
	return chart.Timeline(req.Plot, inst.Timings, inst.Events, inst.StartupSet)
}

// holdUntilStopOrExit returns when ctx ends (Ctrl-C, SIGTERM) or the VM's
// process exits on its own: a held VM that is gone holds nothing worth
// waiting for.
func holdUntilStopOrExit(ctx context.Context, inst *restore.Instance) {
	select {
	case <-ctx.Done():
	case <-inst.Exited():
	}
}
