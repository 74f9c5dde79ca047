package main

import (
	"context"
	"fmt"

	"warmstart/internal/api"
	"warmstart/internal/cli"
	"warmstart/internal/ops"
	"warmstart/internal/report"

	"github.com/spf13/cobra"
)

func init() {
	var vf cli.VMMFlags
	cmd := &cobra.Command{
		Use:   "record-manifest ID|ALIAS",
		Short: "Record a snapshot's startup manifest now and attach it",
		Long: `Restore a throwaway instance of the snapshot with access tracing on, take
the memory it touches until the guest agent is ready, build the startup
manifest (first-touch order, adjacent pages coalesced) and attach it to the
snapshot atomically, replacing any manifest it had. This is what a publish
does in the background when [manifest] record_after_publish is on.`,
		Args: cli.Args(cli.SnapshotArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			if env.Daemon != "" {
				return env.OnDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
					fmt.Fprintf(o.Err, "recording %s on the daemon...\n", args[0])
					res, err := c.RecordManifest(ctx, args[0])
					if err != nil {
						return fmt.Errorf("record-manifest %s: %w", args[0], err)
					}
					return report.Recorded(o.Out, res)
				}, "vmm", "trace")
			}
			// Signals are watched from before the recording's devices are
			// mounted, so that one arriving at any point unmounts them.
			return cli.Interruptible(cmd, func(ctx context.Context) error {
				s, err := env.OpenNode(ctx, cmd, &vf)
				if err != nil {
					return err
				}
				defer s.Close()
				res, err := ops.RecordManifest(ctx, s, args[0], func(id string) {
					fmt.Fprintf(cmd.ErrOrStderr(), "recording %s on the %s device...\n", id, s.Config.Memory.Device)
				})
				if err != nil {
					return cli.OpError("record-manifest", args[0], err)
				}
				return report.Recorded(cmd.OutOrStdout(), res)
			})
		},
	}
	vf.Register(cmd)
	snapshotCmd.AddCommand(cmd)
}
