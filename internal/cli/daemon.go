package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

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
func (f daemonFlag) Type() string   { return "address" }

func (f daemonFlag) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("empty: want unix:PATH, a socket PATH, http(s)://HOST:PORT or HOST:PORT; leave --daemon out to run in this process")
	}
	addr, err := DaemonAddress(v)
	if err != nil {
		return err
	}
	*f.socket = addr
	return nil
}

// DaemonEnv names the environment variable that names the daemon when
// --daemon does not.
const DaemonEnv = "WARMSTART_DAEMON"

// DaemonAddress turns the forms a daemon's address is written in into the
// endpoint api.Dial takes: unix:PATH and PATH are a Unix socket,
// http(s)://HOST:PORT is TCP, and HOST:PORT (a port number after the last
// colon, no slash) is http://HOST:PORT, unless a file of that name exists
// (a socket may be called anything).
func DaemonAddress(v string) (string, error) {
	if path, ok := strings.CutPrefix(v, "unix:"); ok && !strings.HasPrefix(path, "//") {
		if path == "" {
			return "", fmt.Errorf("%q: no socket path after unix:", v)
		}
		return path, nil
	}
	if strings.Contains(v, "://") {
		return v, checkDaemonURL(v)
	}
	_, statErr := os.Stat(v)
	switch {
	case !errors.Is(statErr, os.ErrNotExist):
		return v, nil // a socket may be called anything
	case hostPort(v):
		return "http://" + v, nil
	}
	if port, ok := numericPort(v); ok {
		return "", fmt.Errorf("%q: port %s: want 1..65535 (no socket of that name either)", v, port)
	}
	return v, nil
}

// numericPort returns the decimal port of v when v reads as HOST:PORT, a
// number after the last colon and no slash, whatever the number's range.
func numericPort(v string) (string, bool) {
	if strings.Contains(v, "/") {
		return "", false
	}
	_, port, err := net.SplitHostPort(v)
	if err != nil || port == "" {
		return "", false
	}
	_, err = strconv.ParseUint(port, 10, 64)
	return port, err == nil
}

// hostPort reports whether v reads as HOST:PORT rather than a path.
func hostPort(v string) bool {
	if strings.Contains(v, "/") {
		return false
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil || port == "" {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n > 0 && n < 65536 && (host != "" || strings.HasPrefix(v, ":"))
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
		"run the verb on the daemon at this address (unix:PATH, PATH, http://HOST:PORT or HOST:PORT; default: $"+DaemonEnv+") instead of in this process")
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

// daemonClient returns a client for the daemon --daemon names, else
// $WARMSTART_DAEMON, else the configuration's [daemon] socket when a
// daemon answers there; without any, an error saying how to name one.
func (e *Env) daemonClient(cmd *cobra.Command) (*api.Client, error) {
	if e.Daemon == "" {
		addr, err := e.configuredDaemon(cmd)
		if err != nil {
			return nil, err
		}
		e.Daemon = addr
	}
	c, err := api.Dial(e.Daemon, e.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("%s --daemon %s: %w", verbName(cmd), e.Daemon, err)
	}
	return c, nil
}

// configuredDaemon is the configuration's [daemon] socket when a daemon
// answers on it.
func (e *Env) configuredDaemon(cmd *cobra.Command) (string, error) {
	cfg, err := e.Config()
	if err != nil {
		return "", err
	}
	sock := cfg.Daemon.Socket
	conn, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return "", fmt.Errorf("%s needs a daemon: none answers on [daemon] socket %s (%w); start one with `warmstart serve`, or name one with --daemon ADDRESS or $%s (unix:PATH, PATH, http://HOST:PORT or HOST:PORT)",
			verbName(cmd), sock, errors.Unwrap(err), DaemonEnv)
	}
	conn.Close()
	return sock, nil
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

// HideDaemonInHelp keeps the inherited --daemon flag out of the help of
// cmd, a verb that refuses it (it runs in this process only), so its help
// offers nothing it would refuse. The flag stays inherited, so giving it
// still reaches the verb's own refusal rather than an unknown-flag error.
func HideDaemonInHelp(cmd *cobra.Command) {
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		// The inherited flag is the parent's own *pflag.Flag: hide it only
		// while this help is written, so siblings' help still lists it.
		if f := c.InheritedFlags().Lookup("daemon"); f != nil && !f.Hidden {
			f.Hidden = true
			defer func() { f.Hidden = false }()
		}
		c.Parent().HelpFunc()(c, args)
	})
}
