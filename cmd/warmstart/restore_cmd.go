package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/cli"
	"warmstart/internal/config"
	"warmstart/internal/interrupt"
	"warmstart/internal/lab/chart"
	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/restore"
)

// restoreFlags are restore's flags: what the restore should do, bound
// straight into the request the daemon takes too, and how to present it.
type restoreFlags struct {
	vf       cli.VMMFlags
	req      api.RestoreRequest
	ioEngine config.IOEngineSetting // req.IOEngine once --io-engine is given
	hold     bool
	asJSON   bool
	plotPath string
}

func init() { rootCmd.AddCommand(newRestoreCmd()) }

func newRestoreCmd() *cobra.Command {
	var f restoreFlags
	cmd := &cobra.Command{
		Use:   "restore ID|ALIAS",
		Short: "Restore a snapshot through its memory device and report the phases",
		Long: `Restore a snapshot: acquire its memory device, validate its startup
manifest, prefetch it concurrently with the VMM loading the snapshot, wait
for the guest agent, print the phase timings, then stop in order (stop the
VM, wait for prefetch reads, release the device).

--prefetch auto follows [prefetch] on_restore;
on prefetches whenever a valid manifest is attached; off never does.

--json prints the same document in process and with --daemon: id,
snapshot, device, io_engine, policy, generation, started_at, the phase
timings (integer nanoseconds, keys ending in _ns), prefetch, device_bytes,
ready, startup_set and state (docs/json.md). It prints it once the verb
has stopped the restore (state "stopped", and how under "stop"); with
--hold, at ready (state "running").

SIGINT or SIGTERM stops the restore in order and the verb exits
128+signal; a held restore (--hold) ends that way and exits 0. With
--daemon and without --hold, a signal before the daemon answers cancels
the request (the daemon stops a restore whose client left), and one
after it still sends the stop.`,
		Args: cli.Args(cli.SnapshotArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.req.Snapshot = args[0]
			if err := f.check(cmd); err != nil {
				return usageError{Err: err}
			}
			if err := cli.CheckFileFlag("--plot", f.plotPath, chart.CheckPath); err != nil {
				return err
			}
			if env.Daemon != "" {
				return f.onDaemon(cmd)
			}
			return restoreInProcess(cmd, &f)
		},
	}
	f.vf.Register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.req.Prefetch, "prefetch", "auto", "startup prefetch: auto ([prefetch] on_restore), on or off")
	fl.StringVar(&f.req.Device, "device", "", "memory device: file (FUSE) or uffd (default from [memory] device)")
	fl.StringVar(&f.req.Policy, "policy", "", "prefetch policy: seed, reap, e2b or warmstart (default from [prefetch] policy)")
	fl.Var(&f.ioEngine, "io-engine", "I/O engine: buffered, buffered_async or direct, or 0, 1, 2 (default from [memory] io_engine)")
	fl.Lookup("io-engine").DefValue = "" // the configured engine, not the zero value
	fl.BoolVar(&f.hold, "hold", false, "keep the VM running until Ctrl-C; if it exits first, say how and exit 1 (with --daemon: leave it with the daemon)")
	fl.BoolVar(&f.asJSON, "json", false, "print the result as JSON")
	fl.BoolVar(&f.req.Pausable, "pausable", false, "restore so that the VM can be paused into a child snapshot (restores snapshot ID, with --daemon --hold)")
	fl.StringVar(&f.plotPath, "plot", "", "draw the restore's timeline (device acquired, VM started, prefetch and demand bytes over time, ready) to FILE.svg or FILE.png")
	fl.String(cli.StoreFlag, "", "POSIX snapshot store directory (overrides [backend.posix_fs] snapshot_store)")
	env.AddDaemonFlag(cmd)
	return cmd
}

// check refuses what no restore can use before anything is mounted
// (ops.CheckRestoreRequest). An --io-engine given is the request's; left
// out, the configured engine applies. An empty --device given explicitly
// is refused: the request reads "" as the configured device.
func (f *restoreFlags) check(cmd *cobra.Command) error {
	if cmd.Flags().Changed("io-engine") {
		engine := int(f.ioEngine)
		f.req.IOEngine = &engine
	}
	if cmd.Flags().Changed("device") {
		if err := ops.CheckDevice(f.req.Device, ops.Flags); err != nil {
			return err
		}
	}
	// Only a daemon can pause a restore (restores snapshot), and only one
	// it still holds: anything else would restore and never be paused.
	if f.req.Pausable && (env.Daemon == "" || !f.hold) {
		return errors.New("--pausable needs --daemon and --hold: only a restore the daemon holds can be paused (restores snapshot ID)")
	}
	return ops.CheckRestoreRequest(f.req, ops.Flags)
}

// restoreInProcess restores in this process, prints the restore as the
// daemon describes it, holds it if asked, and stops it in order. Signals
// are watched from before the first device is mounted: one arriving at
// any point stops the restore in order and unmounts, and the verb exits
// 128+signal, except that a signal is how a held restore ends, which
// exits 0 once it has stopped cleanly.
func restoreInProcess(cmd *cobra.Command, f *restoreFlags) error {
	in := interrupt.NotifyBounded(cmd.ErrOrStderr())
	err := in.Result(restoreWatched(in.Work, cmd, f))
	if stopped := (interrupt.Error{}); f.hold && errors.As(err, &stopped) && stopped.Err == nil {
		return nil
	}
	return err
}

// restoreWatched is restoreInProcess's work; ctx ends at the first signal.
func restoreWatched(ctx context.Context, cmd *cobra.Command, f *restoreFlags) error {
	f.vf.ReadOnly = true
	// Refused before anything is opened, as the daemon refuses it.
	f.vf.Check = func(cfg *config.Config, driver string) error {
		return ops.CheckRestoreOnDriver(cfg, f.req, driver, ops.Flags)
	}
	n, err := env.OpenNode(ctx, cmd, &f.vf)
	if err != nil {
		return err
	}
	defer n.Close()
	opts, err := ops.RestoreOptions(n.Config, f.req, ops.Flags)
	if err != nil {
		return usageError{Err: err}
	}
	o := cli.Output(cmd)
	inst, info, err := ops.Restore(ctx, n, f.req.Snapshot, opts, ops.Flags)
	if err != nil {
		return err
	}
	if err := f.print(o, info, inst); err != nil {
		inst.Stop(context.Background())
		return err
	}
	if f.hold {
		fmt.Fprintln(o.Err, "holding the VM; Ctrl-C stops it")
		// A held VM that exited on its own holds nothing worth waiting for.
		select {
		case <-ctx.Done():
		case <-inst.Exited():
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := inst.StopReported(sctx)
	if err != nil {
		return err
	}
	return cli.RestoreStopped(o, info, rep, f.asJSON, f.hold)
}

// print prints a ready restore for people, or as JSON when the verb holds
// it (--hold: the document says "running", the truth while it is held),
// and draws the timeline of an in-process one (inst) when asked. Without
// --hold, --json prints once the restore has stopped (cli.RestoreStopped).
func (f *restoreFlags) print(o report.Output, info api.RestoreInfo, inst *restore.Instance) error {
	if !f.asJSON || f.hold {
		if err := report.RestoreResult(o.Out, info, f.asJSON); err != nil {
			return err
		}
	}
	if f.plotPath == "" {
		return nil
	}
	if err := chart.Timeline(f.plotPath, inst.Timings, inst.Events, inst.StartupSet); err != nil {
		return err
	}
	fmt.Fprintf(o.Err, "wrote %s\n", f.plotPath)
	return nil
}

// onDaemon restores on the daemon. The daemon keeps no timeline, so --plot
// is refused here.
func (f *restoreFlags) onDaemon(cmd *cobra.Command) error {
	if cmd.Flags().Changed("plot") {
		if err := cli.LocalOnly(cmd, "vmm", "trace", cli.StoreFlag); err != nil {
			return err
		}
		return usageError{Err: errors.New("--plot draws the timeline of an in-process restore; the daemon keeps none")}
	}
	return env.OnDaemon(cmd, func(_ context.Context, c *api.Client, o report.Output) error {
		// A signal cancels the request (the daemon then stops a restore
		// whose client left) or, once the answer is in, still lets the
		// verb stop the restore it does not hold, then exits 128+signal.
		in := interrupt.NotifyBounded(o.Err)
		return in.Result(f.restoreOn(in.Work, c, o))
	}, "vmm", "trace", cli.StoreFlag)
}

// restoreOn restores on the daemon and prints what restore prints in
// process. With --hold the daemon keeps the VM, and the verb names the
// command that stops it; without, the verb stops the VM after printing.
func (f *restoreFlags) restoreOn(ctx context.Context, c *api.Client, o report.Output) error {
	info, err := c.Restore(ctx, f.req)
	if err != nil {
		return fmt.Errorf("restore %s: %w", f.req.Snapshot, err)
	}
	if err := f.print(o, info, nil); err != nil {
		return err
	}
	if f.hold {
		fmt.Fprintf(o.Err, "the daemon holds restore %s; stop it with: warmstart --daemon %s restores stop %s\n", info.ID, env.Daemon, info.ID)
		return nil
	}
	// Stopped even when ctx ended since the answer (the verb was
	// interrupted): nothing else would stop this restore, which the
	// caller does not hold. The daemon bounds the stop.
	rep, err := c.StopRestore(context.WithoutCancel(ctx), info.ID)
	if err != nil {
		return fmt.Errorf("restore %s: stop: %w", f.req.Snapshot, err)
	}
	return cli.RestoreStopped(o, info, rep.StopReport, f.asJSON, f.hold)
}
