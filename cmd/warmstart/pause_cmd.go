package main

import (
	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/cli"
)

// pauseCommand is "restores snapshot ID": pause a pausable restore the
// daemon holds into a child snapshot.
func pauseCommand() *cobra.Command {
	var req api.PauseRequest
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "snapshot ID [--alias A] [--then resume|stop] [--json]",
		Short: "Pause a restore started with --pausable into a child snapshot",
		Long: `Pauses the restore's VM, saves its device state and the pages its guest
changed since it was restored (or since its last pause), and publishes them
as a child snapshot: a diff layer over the snapshot it was restored from,
which the child names and does not copy. With --then resume (the default)
the VM runs again as soon as its state is saved, and a later pause makes a
child of this child; with --then stop it stops once the child is published.
A pause that fails resumes the VM and publishes nothing. Exit 4: --then
stop published the child (printed) and the stop that followed failed.`,
		Args: cli.Args(restoreIDArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return env.Pause(cmd, args[0], req, asJSON)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&req.Alias, "alias", "", "bind ALIAS to the child")
	fl.StringVar(&req.Then, "then", api.ThenResume, "resume: the VM runs on; stop: it stops once the child is published")
	fl.BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}
