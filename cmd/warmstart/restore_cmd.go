package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"warmstart/internal/chart"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
)

func init() {
	var (
		vf       vmmFlags
		mode     string
		device   string
		policy   string
		hold     bool
		asJSON   bool
		ioEngine int
		plotPath string
	)
	cmd := &cobra.Command{
		Use:   "restore ID|ALIAS",
		Short: "Restore a snapshot through its memory device and report the phases",
		Long: `Restore a snapshot: acquire its memory device, validate its startup
manifest, prefetch it concurrently with the VMM loading the snapshot, wait
for the guest agent, print the phase timings, then stop in order (stop the
VM, wait for prefetch reads, release the device).

--prefetch auto follows [snapshot.memory_startup_pack] consume_enabled;
on prefetches whenever a valid manifest is attached; off never does.`,
		Args: argsAsUsageError(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := restore.ParseMode(mode)
			if err != nil {
				return usageError{err}
			}
			if err := checkRestoreFlags(device, ioEngine, policy); err != nil {
				return err
			}
			if err := checkPlotFlag(plotPath, false); err != nil {
				return err
			}
			if daemonSocket != "" {
				return daemonRestore(cmd, args[0], m, device, policy, ioEngine, hold, asJSON)
			}
			vf.readOnly = true
			s, err := openSystem(cmd, &vf)
			if err != nil {
				return err
			}
			defer s.close()
			if device == "" {
				device = s.cfg.Memory.Device
			}
			if policy == "" {
				policy = s.cfg.Prefetch.Policy
			}
			p, err := restore.LookupPolicy(policy)
			if err != nil {
				return usageError{err}
			}
			if !cmd.Flags().Changed("io-engine") {
				ioEngine = s.cfg.Memory.IOEngine
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			src, err := s.resolve(ctx, args[0])
			if err != nil {
				return err
			}
			inst, err := s.restorer.Restore(ctx, src, restore.Options{Device: device, IOEngine: ioEngine, Prefetch: m, Policy: p})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if err := reportRestore(out, inst, src.SnapshotID, device, p.Name, asJSON, plotPath); err != nil {
				inst.Stop(context.Background())
				return err
			}
			if hold {
				fmt.Fprintln(cmd.ErrOrStderr(), "holding the VM; Ctrl-C stops it")
				holdUntilStopOrExit(ctx, inst)
			}
			sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rep, err := inst.StopReported(sctx)
			if err != nil {
				return err
			}
			if !asJSON {
				fmt.Fprintf(out, "  stopped: prefetch drained in %v, device release acknowledged in %v\n",
					rep.PrefetchDrain.Round(time.Microsecond), rep.ReleaseAck.Round(time.Microsecond))
			}
			if rep.Exit != nil {
				// Everything is released; the VM's end is still a failure.
				return fmt.Errorf("restore %s: the VM exited after ready: %v", src.SnapshotID, rep.Exit)
			}
			return nil
		},
	}
	vf.register(cmd)
	cmd.Flags().StringVar(&mode, "prefetch", "auto", "startup prefetch: auto (config consume_enabled), on or off")
	cmd.Flags().StringVar(&device, "device", "", "memory device: file (FUSE) or uffd (default from [memory] device)")
	cmd.Flags().StringVar(&policy, "policy", "", "prefetch policy: seed, reap, e2b or warmstart (default from [prefetch] policy)")
	cmd.Flags().IntVar(&ioEngine, "io-engine", 0, "I/O engine: 0 or 1 buffered, 2 direct I/O (default from [memory] io_engine)")
	cmd.Flags().BoolVar(&hold, "hold", false, "keep the VM running until Ctrl-C; if it exits first, say how and exit 1 (with --daemon: leave it with the daemon)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	cmd.Flags().StringVar(&plotPath, "plot", "", "draw the restore's timeline (device acquired, VM started, prefetch and demand bytes over time, ready) to FILE.svg or FILE.png")
	cmd.Flags().String(storeFlag, "", "POSIX snapshot store directory (overrides [backend.posix_fs] snapshot_store)")
	rootCmd.AddCommand(cmd)
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

// reportRestore prints an in-process restore at ready, as JSON or for a
// person, and draws its timeline to plotPath when set.
func reportRestore(out io.Writer, inst *restore.Instance, snapshot, device, policy string, asJSON bool, plotPath string) error {
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		enc.Encode(map[string]any{"snapshot": snapshot, "device": device, "generation": inst.Generation,
			"timings": inst.Timings, "prefetch": inst.Prefetch, "device_bytes": inst.DeviceBytes, "ready": inst.Ready.Detail,
			"startup_set": inst.StartupSet})
	} else {
		ms := func(d time.Duration) string { return fmt.Sprintf("%8.2f ms", float64(d)/1e6) }
		fmt.Fprintf(out, "snapshot %s on %s device, generation %d\n", snapshot, device, inst.Generation)
		fmt.Fprintf(out, "  device acquired     %s\n", ms(inst.Timings.DeviceAcquired))
		fmt.Fprintf(out, "  manifest validated  %s\n", ms(inst.Timings.ManifestValidated))
		fmt.Fprintf(out, "  VM started          %s\n", ms(inst.Timings.VMStarted))
		fmt.Fprintf(out, "  ready               %s\n", ms(inst.Timings.Ready))
		fmt.Fprintf(out, "  prefetch            %s", inst.Prefetch.State)
		if inst.Prefetch.Reason != "" {
			fmt.Fprintf(out, " (%s)", inst.Prefetch.Reason)
		}
		if inst.Prefetch.PlannedBytes > 0 {
			fmt.Fprintf(out, ", %.1f MiB planned, policy %s", float64(inst.Prefetch.PlannedBytes)/(1<<20), policy)
		}
		fmt.Fprintf(out, "\n  device read         %.1f MiB in %d requests\n", float64(inst.DeviceBytes.BytesRead)/(1<<20), inst.DeviceBytes.ReadRequests)
		fmt.Fprintf(out, "  %s\n", startupset.Line(inst.StartupSet))
	}
	if plotPath == "" {
		return nil
	}
	return chart.Timeline(plotPath, inst.Timings, inst.Events, inst.StartupSet)
}
