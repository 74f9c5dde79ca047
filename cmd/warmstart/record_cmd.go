package main

import (
	"context"

	"warmstart/internal/api"
	"warmstart/internal/local"
	"warmstart/internal/remote"
	"warmstart/internal/report"
	"warmstart/internal/usage"

	"github.com/spf13/cobra"
)

func init() {
	var vf vmmFlags
	cmd := &cobra.Command{
		Use:   "record-manifest ID|ALIAS",
		Short: "Record a snapshot's startup manifest now and attach it",
		Long: `Restore a throwaway instance of the snapshot with access tracing on, take
the memory it touches until the guest agent is ready, build the startup
manifest (first-touch order, adjacent pages coalesced) and attach it to the
snapshot atomically, replacing any manifest it had. This is what a publish
does in the background when [snapshot.memory_startup_pack] enabled is on.`,
		Args: usage.Args(snapshotArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			if daemonSocket != "" {
				return onDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
					return remote.RecordManifest(ctx, c, o, args[0])
				}, "vmm", "trace")
			}
			// Signals are watched from before the recording's devices are
			// mounted, so that one arriving at any point unmounts them.
			return interruptible(cmd, func(ctx context.Context) error {
				s, err := openSystem(cmd, &vf)
				if err != nil {
					return err
				}
				defer s.Close()
				return local.RecordManifest(ctx, s, cmdOutput(cmd), args[0])
			})
		},
	}
	vf.register(cmd)
	snapshotCmd.AddCommand(cmd)
}
