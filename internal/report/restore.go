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
	if in.Passthrough {
		fmt.Fprintf(out, "  memory              FUSE passthrough: the kernel served the lower file, no block checked before the guest saw it\n")
	}
	fmt.Fprintf(out, "  %s\n", costLine(in.Cost))
	fmt.Fprintf(out, "  %s\n", startupset.Line(in.StartupSet))
}

// costLine is the restore's CPU and I/O until ready in one line.
func costLine(c restore.Cost) string {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	s := fmt.Sprintf("cost until ready    node CPU %.1f ms (user %.1f, system %.1f)", ms(c.Node.CPU()), ms(c.Node.User), ms(c.Node.System))
	if c.VMM != nil {
		s += fmt.Sprintf(", VMM CPU %.1f ms, VMM major faults %d", ms(c.VMM.CPU()), c.VMM.MajorFaults)
	}
	return s + fmt.Sprintf(", %.1f MiB read from storage, %.1f MiB copied",
		float64(c.Node.StorageReadBytes)/(1<<20), float64(c.CopiedBytes)/(1<<20))
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
