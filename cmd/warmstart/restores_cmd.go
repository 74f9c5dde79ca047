package main

import (
	"context"
	"fmt"
	"regexp"

	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/cli"
	"warmstart/internal/report"
)

func init() {
	restoresCmd := &cobra.Command{
		Use:   "restores",
		Short: "List, pause or stop the restores a daemon holds (--daemon, $WARMSTART_DAEMON or [daemon] socket)",
		Long: `A restore run with --daemon and --hold stays with the daemon after the verb
exits. "restores list" shows them; "restores stop ID" stops one in the
seed's order (stop the VM, wait for prefetch reads, release the device);
"restores snapshot ID" pauses one started with --pausable into a child
snapshot.`,
	}
	var listJSON bool
	listCmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the restores the daemon holds, oldest first",
		Args:  cli.Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return env.OnDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
				infos, err := c.Restores(ctx)
				if err != nil {
					return fmt.Errorf("restores list: %w", err)
				}
				if listJSON {
					return report.JSON(o.Out, infos)
				}
				return report.Restores(o.Out, infos)
			})
		},
	}
	listCmd.Flags().BoolVar(&listJSON, "json", false, "print JSON")
	stopCmd := &cobra.Command{
		Use:   "stop ID",
		Short: "Stop a restore the daemon holds",
		Args:  cli.Args(restoreIDArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return env.OnDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
				rep, err := c.StopRestore(ctx, args[0])
				if err != nil {
					return fmt.Errorf("restores stop: %w", err)
				}
				report.Stopped(o.Out, rep.StopReport)
				return nil
			})
		},
	}
	env.AddDaemonFlag(restoresCmd)
	restoresCmd.AddCommand(listCmd, stopCmd, pauseCommand())
	rootCmd.AddCommand(restoresCmd)
}

// restoreIDArg accepts one argument that can be a restore id (what
// "restores list" prints: letters, digits and dashes), so that a path-like
// one (".", "a/b") is refused as such and not as whatever its URL hits.
func restoreIDArg(cmd *cobra.Command, args []string) error {
	if err := cobra.ExactArgs(1)(cmd, args); err != nil {
		return err
	}
	if id := args[0]; !restoreIDPattern.MatchString(id) {
		return fmt.Errorf("restore id %q: want the letters, digits and dashes restores list prints", id)
	}
	return nil
}

var restoreIDPattern = regexp.MustCompile(`^[A-Za-z0-9-]{1,128}$`)
