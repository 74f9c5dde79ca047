package cli

import (
	"fmt"

	"warmstart/internal/api"
	"warmstart/internal/report"
	"warmstart/internal/restore"
)

// RestoreStopped prints how the restore in info stopped: for people, or,
// with asJSON and without hold, the restore's document with state
// "stopped" and the stop report (docs/json.md). A VM that exited after
// ready fails the restore once everything is released.
func RestoreStopped(o report.Output, info api.RestoreInfo, rep restore.StopReport, asJSON, hold bool) error {
	switch {
	case !asJSON:
		report.Stopped(o.Out, rep)
	case !hold:
		info.State, info.Exit, info.Stop = restore.StateStopped, rep.Exit, &rep
		if err := report.JSON(o.Out, info); err != nil {
			return err
		}
	}
	if rep.Exit != nil {
		return fmt.Errorf("restore %s: the VM exited after ready: %v", info.Snapshot, rep.Exit)
	}
	return nil
}
