package report

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
)

// restoreState is a restore's state for people: running, or exited and how.
func restoreState(in api.RestoreInfo) string {
	if in.Exit != nil {
		return in.State + ": " + in.Exit.String()
	}
	return in.State
}

// Restore prints a ready restore for people: its phase timings, prefetch,
// device reads and startup-set line.
func Restore(out io.Writer, in api.RestoreInfo) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%8.2f ms", float64(d)/1e6) }
	fmt.Fprintf(out, "restore %s of snapshot %s on %s device, generation %d\n", in.ID, in.Snapshot, in.Device, in.Generation)
	fmt.Fprintf(out, "  device acquired     %s\n", ms(in.Timings.DeviceAcquired))
	fmt.Fprintf(out, "  manifest validated  %s\n", ms(in.Timings.ManifestValidated))
	fmt.Fprintf(out, "  VM started          %s\n", ms(in.Timings.VMStarted))
	fmt.Fprintf(out, "  ready               %s\n", ms(in.Timings.Ready))
	fmt.Fprintf(out, "  prefetch            %s", in.Prefetch.State)
	if in.Prefetch.Reason != "" {
		fmt.Fprintf(out, " (%s)", in.Prefetch.Reason)
	}
	if in.Prefetch.PlannedBytes > 0 {
		fmt.Fprintf(out, ", %.1f MiB planned%s%s, policy %s", float64(in.Prefetch.PlannedBytes)/(1<<20), leftToDemand(in.Prefetch), gapsTaken(in.Prefetch), in.Policy)
	}
	if in.Prefetch.Manifest != "" {
		fmt.Fprintf(out, ", %s manifest", in.Prefetch.Manifest)
	}
	if in.Prefetch.Fallback != "" {
		fmt.Fprintf(out, " (%s)", in.Prefetch.Fallback)
	}
	if in.Prefetch.StartupPackSkipped != "" {
		fmt.Fprintf(out, "\n  startup pack        skipped, startup set read from the chunks (%s)", in.Prefetch.StartupPackSkipped)
	}
	fmt.Fprintf(out, "\n  device read         %.1f MiB in %d requests\n", float64(in.DeviceBytes.BytesRead)/(1<<20), in.DeviceBytes.ReadRequests)
	fmt.Fprintf(out, "  %s\n", startupset.Line(in.StartupSet))
}

// gapsTaken notes what the plan read beyond the manifest, "" when
// nothing.
func gapsTaken(p restore.PrefetchReport) string {
	if p.GapBytes <= 0 {
		return ""
	}
	return fmt.Sprintf(" (+%.1f MiB of small gaps taken along)", float64(p.GapBytes)/(1<<20))
}

// leftToDemand notes the planned bytes the memory source left to demand
// faults, "" when none.
func leftToDemand(p restore.PrefetchReport) string {
	if p.LeftToDemandBytes <= 0 {
		return ""
	}
	return fmt.Sprintf(" (%.1f MiB of it left to demand)", float64(p.LeftToDemandBytes)/(1<<20))
}

// Stopped prints how a restore stopped: the VM's exit when it had gone,
// the prefetch drain and the device release.
func Stopped(out io.Writer, rep restore.StopReport) {
	if rep.Exit != nil {
		fmt.Fprintf(out, "  the VM had exited after ready: %v\n", rep.Exit)
	}
	fmt.Fprintf(out, "  stopped: prefetch drained in %v, device release acknowledged in %v\n",
		rep.PrefetchDrain.Round(time.Microsecond), rep.ReleaseAck.Round(time.Microsecond))
}

// Restores writes the table of `restores list`: the restores a daemon
// holds, oldest first.
func Restores(w io.Writer, infos []api.RestoreInfo) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSNAPSHOT\tDEVICE\tSTARTED\tREADY\tPREFETCH\tSTATE")
	for _, in := range infos {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f ms\t%s\t%s\n", in.ID, in.Snapshot, in.Device,
			in.StartedAt.UTC().Format(time.RFC3339), float64(in.Timings.Ready)/1e6, in.Prefetch.State, restoreState(in))
	}
	return tw.Flush()
}

// RestoreResult prints a ready restore, as JSON or for people.
func RestoreResult(w io.Writer, in api.RestoreInfo, asJSON bool) error {
	if asJSON {
		return JSON(w, in)
	}
	Restore(w, in)
	return nil
}
