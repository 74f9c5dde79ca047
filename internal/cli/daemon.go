package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/spf13/cobra"

	"warmstart/internal/api"
	"warmstart/internal/report"
)

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

// Reset sets the flag back to unset, which Set refuses to do (tests run
// many verbs in one process).
func (f daemonFlag) Reset() { *f.socket = "" }

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

// AddDaemonFlag gives cmd, and the verbs below it, the --daemon flag. Only
// the verbs that can run on a daemon have it: elsewhere it is an unknown
// flag (exit 2), never silently ignored.
func (e *Env) AddDaemonFlag(cmd *cobra.Command) {
	cmd.PersistentFlags().Var(daemonFlag{&e.Daemon}, "daemon",
		"run the verb on the daemon at this Unix socket (or http://host:port) instead of in this process")
}

// OnDaemon runs a verb on the daemon --daemon names. It first refuses the
// flags that configure the in-process system (localFlags), which a daemon
// takes from its own configuration. A request the daemon refused as
// malformed is a usage error, as it is in process.
func (e *Env) OnDaemon(cmd *cobra.Command, run func(context.Context, *api.Client, report.Output) error, localFlags ...string) error {
	if err := LocalOnly(cmd, localFlags...); err != nil {
		return err
	}
	c, err := e.daemonClient(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	return refusedAsUsage(run(cmd.Context(), c, Output(cmd)))
}

// daemonClient returns a client for --daemon, or a usage error without it.
func (e *Env) daemonClient(cmd *cobra.Command) (*api.Client, error) {
	if e.Daemon == "" {
		return nil, Error{Err: fmt.Errorf("%s needs --daemon SOCKET", cmd.CommandPath())}
	}
	c, err := api.Dial(e.Daemon, e.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("%s --daemon %s: %w", cmd.CommandPath(), e.Daemon, err)
	}
	return c, nil
}

// LocalOnly refuses flags that configure the in-process system, which a
// daemon takes from its own configuration.
func LocalOnly(cmd *cobra.Command, flags ...string) error {
	for _, name := range flags {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			return Error{Err: fmt.Errorf("--%s configures the in-process system; the daemon uses its own configuration", name)}
		}
	}
	return nil
}

// refusedAsUsage makes a request the daemon refused as malformed a usage
// error, as it is in process.
func refusedAsUsage(err error) error {
	var ae *api.APIError
	if errors.As(err, &ae) && ae.StatusCode == http.StatusBadRequest {
		return Error{Err: err}
	}
	return err
}
