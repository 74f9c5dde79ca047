package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/remote"
	"warmstart/internal/report"
	"warmstart/internal/usage"
)

// daemonSocket is the --daemon flag: verbs that support it run on that
// daemon instead of in this process.
var daemonSocket string

// daemonFlag is the value of --daemon. It refuses an explicitly empty
// value at parsing, for every verb that has the flag: "--daemon
// "$WARMSTART_DAEMON"" with the variable unset would otherwise read as no
// flag and run the verb in this process without a word. Unset, the verb
// still runs in process.
type daemonFlag struct{ socket *string }

func (f daemonFlag) String() string { return *f.socket }
func (f daemonFlag) Type() string   { return "socket" }

func (f daemonFlag) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("empty: want the path of a Unix socket or http(s)://host:port; leave --daemon out to run in this process")
	}
	if err := checkDaemonURL(v); err != nil {
		return err
	}
	*f.socket = v
	return nil
}

// checkDaemonURL refuses, at parsing, a --daemon that names a URL this
// CLI cannot talk to (another scheme, or one that does not parse), so it
// is a usage error naming the mistake rather than a failed dial or a
// complaint about a missing token file.
func checkDaemonURL(v string) error {
	scheme, _, isURL := strings.Cut(v, "://")
	if !isURL {
		return nil // a Unix socket path
	}
	if scheme != "http" && scheme != "https" {
		return fmt.Errorf("%q: scheme %q, want the path of a Unix socket or http(s)://host:port", v, scheme)
	}
	u, err := url.Parse(v)
	if err != nil {
		return fmt.Errorf("%q: malformed URL: %w", v, err)
	}
	if u.Host == "" {
		return fmt.Errorf("%q: no host, want http(s)://host:port", v)
	}
	return nil
}

// reset sets the flag back to unset, which Set refuses to do (tests run
// many verbs in one process).
func (f daemonFlag) reset() { *f.socket = "" }

// addDaemonFlag gives cmd, and the verbs below it, the --daemon flag. Only
// the verbs that can run on a daemon have it: elsewhere it is an unknown
// flag (exit 2), never silently ignored.
func addDaemonFlag(cmd *cobra.Command) {
	cmd.PersistentFlags().Var(daemonFlag{&daemonSocket}, "daemon",
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
		Args:  usage.Args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return onDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
				return remote.Restores(ctx, c, o, listJSON)
			})
		},
	}
	listCmd.Flags().BoolVar(&listJSON, "json", false, "print JSON")
	stopCmd := &cobra.Command{
		Use:   "stop ID",
		Short: "Stop a restore the daemon holds",
		Args:  usage.Args(restoreIDArg),
		RunE: func(cmd *cobra.Command, args []string) error {
			return onDaemon(cmd, func(ctx context.Context, c *api.Client, o report.Output) error {
				return remote.StopRestore(ctx, c, o, args[0])
			})
		},
	}
	addDaemonFlag(restoresCmd)
	restoresCmd.AddCommand(listCmd, stopCmd)
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

// onDaemon runs a verb on the daemon --daemon names. It first refuses the
// flags that configure the in-process system (localFlags), which a daemon
// takes from its own configuration.
func onDaemon(cmd *cobra.Command, run func(context.Context, *api.Client, report.Output) error, localFlags ...string) error {
	if err := localOnly(cmd, localFlags...); err != nil {
		return err
	}
	c, err := daemonClient(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	return refusedAsUsage(run(cmd.Context(), c, cmdOutput(cmd)))
}

// daemonClient returns a client for --daemon, or a usage error without it.
func daemonClient(cmd *cobra.Command) (*api.Client, error) {
	if daemonSocket == "" {
		return nil, usageError{Err: fmt.Errorf("%s needs --daemon SOCKET", cmd.CommandPath())}
	}
	c, err := api.Dial(daemonSocket, tokenFile)
	if err != nil {
		return nil, fmt.Errorf("%s --daemon %s: %w", cmd.CommandPath(), daemonSocket, err)
	}
	return c, nil
}

// tokenFile is the API token file the configuration names ([daemon]
// token_file).
func tokenFile() (string, error) {
	cfg, err := loadConfig()
	if err != nil {
		return "", err
	}
	return cfg.DaemonTokenFile(), nil
}

// localOnly refuses flags that configure the in-process system, which a
// daemon takes from its own configuration.
func localOnly(cmd *cobra.Command, flags ...string) error {
	for _, name := range flags {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return usageError{Err: fmt.Errorf("--%s configures the in-process system; the daemon uses its own configuration", name)}
		}
	}
	return nil
}

// refusedAsUsage makes a request the daemon refused as malformed a usage
// error, as it is in process.
func refusedAsUsage(err error) error {
	var ae *api.APIError
	if errors.As(err, &ae) && ae.StatusCode == http.StatusBadRequest {
		return usageError{Err: err}
	}
	return err
}
