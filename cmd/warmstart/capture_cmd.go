package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/config"
	"warmstart/internal/interrupt"
	"warmstart/internal/ops"
	"warmstart/internal/recorder"
	"warmstart/internal/report"
)

// captureFlags are capture's flags.
type captureFlags struct {
	vf     cli.VMMFlags
	alias  string
	agent  string
	asJSON bool
}

func init() { rootCmd.AddCommand(newCaptureCmd()) }

func newCaptureCmd() *cobra.Command {
	var f captureFlags
	cmd := &cobra.Command{
		Use:   "capture",
		Short: "Boot a fresh guest, capture it and publish the snapshot",
		Long: `Boot a fresh guest, wait until its agent answers, capture the guest and
publish its device state and memory file into the repository with the
guest's memory layout. The memory file is written in a staging directory
inside the POSIX store, so publishing hard-links it instead of copying it.
The new snapshot's id is printed on the first line of standard output.

--vmm qemu (the real test guest here) boots a QEMU microvm from the [qemu]
configuration whose /init is warmstart-agent. --vmm firecracker boots the
[firecracker] kernel and rootfs (attached read-only: every restore of the
snapshot opens the same image) with [firecracker] vcpus and memory_mib,
waits for the agent at [agent] address, then pauses the VM, creates a Full
snapshot and stops the VM; the memory layout comes from the VM's machine
config.

With [manifest] record_after_publish = true the startup manifest is
then recorded in the background from the real guest's memory-device reads,
holding the capture lease, as a publish does; this command waits for the
recording and reports what was attached (a daemon would not wait).

For QEMU the agent is built from the module source with the go tool unless
--agent names a prebuilt binary, and --agent-workload (default: [qemu]
agent_workload) sets what it walks at each resume, e.g.
heap_mib=40,pool_mib=24,pool_fraction=0.33; the snapshot keeps it. A QEMU snapshot restores only under the
accelerator, memory size and vCPU count it was captured with: restore it
with the same [qemu] configuration (the accelerator used is printed; the
record does not keep it).`,
		Args: cli.Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if err := ops.CheckCapture(f.vf.Kind, f.agent, f.vf.AgentWorkload, f.alias); err != nil {
				return usageError{Err: err}
			}
			// A signal stops the capture; the deferred cleanup runs before
			// the verb ends with the signal's exit status.
			in := interrupt.Notify(cmd.ErrOrStderr())
			return in.Result(runCapture(in.Work, cmd, &f))
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.vf.Kind, "vmm", config.DriverQEMU, "VMM driver that boots and captures the guest: qemu or firecracker")
	fl.StringVar(&f.alias, "alias", "", "bind this alias to the new snapshot")
	fl.StringVar(&f.agent, "agent", "", "prebuilt warmstart-agent binary for the QEMU guest (default: build it from the module source)")
	fl.StringVar(&f.vf.AgentWorkload, "agent-workload", "", "the QEMU guest agent's resume workload, e.g. heap_mib=40,pool_mib=24,pool_fraction=0.33 (default: [qemu] agent_workload)")
	fl.BoolVar(&f.asJSON, "json", false, "print the result as JSON")
	fl.String(cli.StoreFlag, "", "POSIX snapshot store directory (overrides [backend.posix_fs] snapshot_store)")
	return cmd
}

// runCapture boots, captures and publishes a guest, waits for its
// manifest's recording when there is one, and prints the result.
func runCapture(ctx context.Context, cmd *cobra.Command, f *captureFlags) error {
	n, err := env.OpenNode(ctx, cmd, &f.vf)
	if err != nil {
		return err
	}
	defer n.Close()
	o := cli.Output(cmd)
	out, job, err := ops.Capture(ctx, n, f.alias, f.agent, o.Err)
	if err != nil {
		return err
	}
	var rec *recorder.Result
	var recErr error
	if job != nil {
		fmt.Fprintln(o.Err, "recording the startup manifest in the background; waiting for it")
		r, err := job.Result()
		rec, recErr = &r, err
	}
	if err := report.Capture(o.Out, f.vf.Kind, out, rec, recErr, f.asJSON); err != nil {
		return err
	}
	if recErr != nil {
		// The snapshot is published and restores with on-demand reads.
		return ops.NotRecorded(out.Record.ID, recErr)
	}
	return nil
}
