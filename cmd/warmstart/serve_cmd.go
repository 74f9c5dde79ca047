package main

import (
	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/daemon"
	"warmstart/internal/interrupt"
)

func init() {
	var listen string
	cmd := &cobra.Command{
		Use:   "serve [--config FILE] [--listen HOST:PORT]",
		Short: "Run the daemon: the HTTP API over snapshots, memory devices and restores",
		Long: `Run warmstart as a daemon. It mounts the FUSE memory device at [memory]
fuse_mount, restores with the VMM driver [vmm] driver names, and serves an
HTTP API with JSON in and out on the Unix socket [daemon] socket, or on a
TCP address with --listen (or [daemon] listen). Over TCP every request must
carry the bearer token in [daemon] token_file (Authorization: Bearer); on a
loopback address serve creates it (mode 0600, default
<runtime.dir>/daemon.token) when missing and logs where; a non-loopback
address is refused unless token_file is set. Clients with --daemon
http://HOST:PORT read WARMSTART_TOKEN or that file. The Unix socket is mode
0600 and needs no token. POST /snapshots/import reads only from
[daemon] import_dirs (every path component resolved beneath one of them,
absolute symlinks refused; empty: imports refused, 403). A token file
open to group or others or owned by another user than the daemon's or
root, or a token under 16 printable characters, is refused at start.

  GET    /healthz, /metrics (Prometheus), /openapi.json (every route)
  GET    /snapshots, /snapshots/{id}      DELETE /snapshots/{id}
  POST   /snapshots/import                {vm_state, memory, alias, layout, link}
  POST   /snapshots/{id}/manifest:record, /snapshots/{id}/verify
  POST   /restores                        {snapshot, device, prefetch, policy, io_engine, pausable}
  GET    /restores, /restores/{id}        DELETE /restores/{id}
  POST   /restores/{id}/snapshot          {alias, then}: pause into a child snapshot

Other verbs run against it with --daemon SOCKET. With
[manifest] record_after_publish, an import records the startup
manifest in the background.

At start, a socket left by a crashed daemon and a dead FUSE mount are
cleaned up; a daemon still answering on the socket is an error. SIGTERM or
SIGINT shuts down in order: stop accepting requests, stop the restores
(stop the VM, wait for prefetch reads), release the memory devices, unmount
FUSE, remove the socket. Every step is bounded, so the shutdown ends by
itself; a second signal says so and changes nothing.`,
		Args: cli.Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := env.Config()
			if err != nil {
				return err
			}
			repo, err := env.OpenRepository(cmd)
			if err != nil {
				return err
			}
			ctx, done := interrupt.Shutdown(cmd.ErrOrStderr())
			defer done()
			return daemon.Serve(ctx, cfg, repo, listen, cmd.ErrOrStderr())
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "serve the API on this TCP address (host:port) instead of [daemon] socket")
	cmd.Flags().String(cli.StoreFlag, "", "POSIX snapshot store directory (overrides [backend.posix_fs] snapshot_store)")
	rootCmd.AddCommand(cmd)
}
