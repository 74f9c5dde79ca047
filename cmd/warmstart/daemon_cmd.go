package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"warmstart/internal/daemon"
	"warmstart/internal/report"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// daemonSocket is the --daemon flag: verbs that support it run on that
// daemon instead of in this process.
var daemonSocket string

// addDaemonFlag gives cmd, and the verbs below it, the --daemon flag. Only
// the verbs that can run on a daemon have it: elsewhere it is an unknown
// flag (exit 2), never silently ignored.
func addDaemonFlag(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&daemonSocket, "daemon", "",
		"run the verb on the daemon at this Unix socket (or http://host:port) instead of in this process")
}

func init() {

	restoresCmd := &cobra.Command{
		Use:   "restores",
		Short: "List or stop the restores a daemon holds (needs --daemon)",
		Long: `A restore run with --daemon and --hold stays with the daemon after the verb
exits. "restores list" shows them; "restores stop ID" stops one in the
seed's order (stop the VM, wait for prefetch reads, release the device).`,
	}
	var listJSON bool
	listCmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the restores the daemon holds, oldest first",
		Args:  argsAsUsageError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := daemonClient(cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			infos, err := c.Restores(cmd.Context())
			if err != nil {
				return daemonError("restores list", err)
			}
			if listJSON {
				return report.JSON(cmd.OutOrStdout(), infos)
			}
			return report.Restores(cmd.OutOrStdout(), infos)
		},
	}
	listCmd.Flags().BoolVar(&listJSON, "json", false, "print JSON")
	stopCmd := &cobra.Command{
		Use:   "stop ID",
		Short: "Stop a restore the daemon holds",
		Args:  argsAsUsageError(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := daemonClient(cmd)
			if err != nil {
				return err
			}
			defer c.Close()
			rep, err := c.StopRestore(cmd.Context(), args[0])
			if err != nil {
				return daemonError("restores stop", err)
			}
			report.Stopped(cmd.OutOrStdout(), rep.StopReport)
			return nil
		},
	}
	addDaemonFlag(restoresCmd)
	restoresCmd.AddCommand(listCmd, stopCmd)
	rootCmd.AddCommand(restoresCmd)
}

// daemonClient returns a client for --daemon, or a usage error without it.
func daemonClient(cmd *cobra.Command) (*daemon.Client, error) {
	if daemonSocket == "" {
		return nil, usageError{fmt.Errorf("%s needs --daemon SOCKET", cmd.CommandPath())}
	}
	c := daemon.NewClient(daemonSocket)
	if !strings.HasPrefix(daemonSocket, "http://") && !strings.HasPrefix(daemonSocket, "https://") {
		return c, nil // the socket is mode 0600: reaching it is authentication
	}
	token, err := daemonToken()
	if err != nil {
		return nil, fmt.Errorf("%s --daemon %s: %w", cmd.CommandPath(), daemonSocket, err)
	}
	return c.WithToken(token), nil
}

// daemonToken is the bearer token for a daemon serving TCP: WARMSTART_TOKEN,
// else the token file the configuration names ([daemon] token_file).
func daemonToken() (string, error) {
	if t := strings.TrimSpace(os.Getenv("WARMSTART_TOKEN")); t != "" {
		return t, nil
	}
	cfg, err := loadConfig()
	if err != nil {
		return "", err
	}
	token, err := daemon.ReadToken(cfg.DaemonTokenFile())
	if err != nil {
		return "", fmt.Errorf("no API token: set WARMSTART_TOKEN or make %s readable: %w", cfg.DaemonTokenFile(), err)
	}
	return token, nil
}

// storeDaemonClient is daemonClient for the verbs that reach the
// repository: their --store configures the in-process system only.
func storeDaemonClient(cmd *cobra.Command) (*daemon.Client, error) {
	if err := localOnly(cmd, storeFlag); err != nil {
		return nil, err
	}
	return daemonClient(cmd)
}

// localOnly refuses flags that configure the in-process system, which a
// daemon takes from its own configuration.
func localOnly(cmd *cobra.Command, flags ...string) error {
	for _, name := range flags {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return usageError{fmt.Errorf("--%s configures the in-process system; the daemon uses its own configuration", name)}
		}
	}
	return nil
}

// daemonError names the verb; a request the daemon refused as malformed
// is a usage error, as it is in process.
func daemonError(verb string, err error) error {
	var ae *daemon.APIError
	if errors.As(err, &ae) && ae.StatusCode == http.StatusBadRequest {
		return usageError{fmt.Errorf("%s: %w", verb, err)}
	}
	return fmt.Errorf("%s: %w", verb, err)
}

func daemonSnapshotImport(cmd *cobra.Command, f snapshotImportOptions) error {
	c, err := storeDaemonClient(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	// The daemon opens the files itself, so they are named absolutely.
	req := daemon.ImportRequest{Alias: f.alias, Layout: f.layout, Link: f.link}
	if req.VMState, err = filepath.Abs(f.vmState); err != nil {
		return err
	}
	if req.Memory, err = filepath.Abs(f.memory); err != nil {
		return err
	}
	rec, err := c.Import(cmd.Context(), req)
	if err != nil {
		return daemonError("snapshot import", err)
	}
	if rec.Recording {
		fmt.Fprintf(cmd.ErrOrStderr(), "the daemon is recording the startup manifest of %s in the background\n", rec.ID)
	}
	_, err = fmt.Fprintln(cmd.OutOrStdout(), rec.ID)
	return err
}

func daemonSnapshotList(cmd *cobra.Command, f repository.Filter, asJSON bool) error {
	c, err := storeDaemonClient(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	rows, err := c.Catalog(cmd.Context(), f)
	if err != nil {
		return daemonError("snapshot list", err)
	}
	return printCatalog(cmd, rows, asJSON)
}

func daemonSnapshotShow(cmd *cobra.Command, ref string, asJSON bool) error {
	c, err := storeDaemonClient(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	info, err := c.Snapshot(cmd.Context(), ref)
	if err != nil {
		return daemonError("snapshot show "+ref, err)
	}
	var (
		res    repository.Resolved
		resErr error
		files  *report.SnapshotFiles
	)
	if info.Files != nil {
		res = repository.Resolved{Record: info.Record, VMStatePath: info.Files.VMState, MemoryPath: info.Files.Memory, ManifestPath: info.Files.Manifest}
		files = &report.SnapshotFiles{VMState: info.Files.VMState, Memory: info.Files.Memory, Manifest: info.Files.Manifest}
	} else {
		resErr = errors.New(info.FilesError)
	}
	if asJSON {
		return report.JSON(cmd.OutOrStdout(), report.SnapshotShow{Record: info.Record, Files: files})
	}
	return report.SnapshotText(cmd.OutOrStdout(), info.Record, res, resErr)
}

func daemonSnapshotDelete(cmd *cobra.Command, ref string) error {
	c, err := storeDaemonClient(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	out := cmd.OutOrStdout()
	del, err := c.DeleteSnapshot(cmd.Context(), ref)
	switch {
	case errors.Is(err, repository.ErrNotFound) && repository.RefIsID(ref):
		_, err = fmt.Fprintf(out, "snapshot %s does not exist; nothing to delete\n", ref)
		return err
	case errors.Is(err, repository.ErrNotFound):
		_, err = fmt.Fprintf(out, "no snapshot has alias %s; nothing to delete\n", ref)
		return err
	case err != nil:
		return daemonError("snapshot delete "+ref, err)
	}
	if del.Alias != "" {
		_, err = fmt.Fprintf(out, "deleted snapshot %s (alias %s)\n", del.ID, del.Alias)
	} else {
		_, err = fmt.Fprintf(out, "deleted snapshot %s\n", del.ID)
	}
	return err
}

func daemonRecordManifest(cmd *cobra.Command, ref string) error {
	if err := localOnly(cmd, "vmm", "trace"); err != nil {
		return err
	}
	c, err := daemonClient(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(cmd.ErrOrStderr(), "recording %s on the daemon...\n", ref)
	res, err := c.RecordManifest(cmd.Context(), ref)
	if err != nil {
		return daemonError("record-manifest "+ref, err)
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "attached startup manifest to %s: sha256 %s, %d bytes encoded, %d ranges, %.1f MiB, %d touches, ready after %v\n",
		res.SnapshotID, res.Descriptor.SHA256, res.Descriptor.Size, res.Ranges, float64(res.Bytes)/(1<<20), res.Touches, res.ReadyAfter)
	return err
}

// daemonRestore restores on the daemon and prints what restore prints in
// process. With hold the daemon keeps the VM and the verb exits; without,
// the verb stops it after printing.
func daemonRestore(cmd *cobra.Command, ref string, mode restore.Mode, device, policy string, ioEngine int, hold, asJSON bool) error {
	if err := localOnly(cmd, "vmm", "trace", storeFlag); err != nil {
		return err
	}
	if cmd.Flags().Changed("plot") {
		return usageError{errors.New("--plot draws the timeline of an in-process restore; the daemon keeps none")}
	}
	c, err := daemonClient(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	req := daemon.RestoreRequest{Snapshot: ref, Device: device, Prefetch: string(mode), Policy: policy}
	if cmd.Flags().Changed("io-engine") {
		req.IOEngine = &ioEngine
	}
	ctx := cmd.Context()
	in, err := c.Restore(ctx, req)
	if err != nil {
		return daemonError("restore "+ref, err)
	}
	out := cmd.OutOrStdout()
	if err := printRestore(cmd, in, asJSON); err != nil {
		return err
	}
	if hold {
		fmt.Fprintf(cmd.ErrOrStderr(), "the daemon holds restore %s; stop it with: warmstart --daemon %s restores stop %s\n", in.ID, daemonSocket, in.ID)
		return nil
	}
	rep, err := c.StopRestore(ctx, in.ID)
	if err != nil {
		return daemonError("restore "+ref+": stop", err)
	}
	if !asJSON {
		report.Stopped(out, rep.StopReport)
	}
	if rep.Exit != nil {
		return fmt.Errorf("restore %s: the VM exited after ready: %v", in.ID, rep.Exit)
	}
	return nil
}
