package cli

import (
	"fmt"
	"sync"

	"github.com/spf13/cobra"

	"warmstart/internal/config"
	"warmstart/internal/logging"
	"warmstart/internal/node"
	"warmstart/internal/repository"
	"warmstart/internal/trust"
)

// StoreFlag names the flag that overrides [backend.posix_fs]
// snapshot_store for the verbs that define it.
const StoreFlag = "store"

// Env is what every verb of one command line shares: the --config and
// --daemon flags, and the configuration, loaded at most once per run of a
// verb however many parts of it ask (the repository, the node, the token).
type Env struct {
	// ConfigPath is --config.
	ConfigPath string
	// Daemon is --daemon: verbs that have it run on that daemon when set.
	Daemon string

	mu     sync.Mutex
	config func() (*config.Config, error)
}

// Register gives root the --config flag, and makes every run of a verb
// below it load the configuration afresh (a process that runs several,
// as tests do, never sees an earlier run's).
func (e *Env) Register(root *cobra.Command) {
	root.PersistentFlags().StringVar(&e.ConfigPath, "config", "",
		"TOML configuration file (default: $"+config.EnvFile+", else "+config.SystemFile+" when present, else the built-in defaults)")
	cobra.OnInitialize(e.reset)
}

func (e *Env) reset() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.config = nil
}

// Config is the configuration config.Path resolves from --config (else
// $WARMSTART_CONFIG, else /etc/warmstart/config.toml when present, else
// the built-in defaults), loaded on the first call of a verb's run.
func (e *Env) Config() (*config.Config, error) {
	e.mu.Lock()
	if e.config == nil {
		path := config.Path(e.ConfigPath)
		e.config = sync.OnceValues(func() (*config.Config, error) { return config.Load(path) })
	}
	load := e.config
	e.mu.Unlock()
	return load()
}

// TokenFile is the API token file the configuration names ([daemon]
// token_file), for api.Dial.
func (e *Env) TokenFile() (string, error) {
	cfg, err := e.Config()
	if err != nil {
		return "", err
	}
	return cfg.DaemonTokenFile(), nil
}

// TrustPolicy is the policy of this node's configuration ([trust]).
func (e *Env) TrustPolicy() (*trust.Policy, error) {
	cfg, err := e.Config()
	if err != nil {
		return nil, err
	}
	return node.TrustPolicy(cfg)
}

// OpenRepository opens the snapshot repository the configuration names.
// A verb that defines --store may point it at another POSIX store
// directory without a configuration file.
func (e *Env) OpenRepository(cmd *cobra.Command) (repository.Repository, error) {
	return e.openRepository(cmd, false)
}

// OpenReadOnlyRepository is OpenRepository for verbs that only read: a
// POSIX store is opened without creating, locking or sweeping anything,
// and a store that does not exist is an error naming it; an S3 repository
// is opened without writing to the bucket or creating anything at open.
func (e *Env) OpenReadOnlyRepository(cmd *cobra.Command) (repository.Repository, error) {
	return e.openRepository(cmd, true)
}

func (e *Env) openRepository(cmd *cobra.Command, readOnly bool) (repository.Repository, error) {
	cfg, err := e.Config()
	if err != nil {
		return nil, err
	}
	o := node.RepositoryOptions{ReadOnly: readOnly, Warn: func(err error) {
		fmt.Fprintf(cmd.ErrOrStderr(), "warmstart: warning: %v (the store is usable; the next writable open tries again)\n", err)
	}}
	if f := cmd.Flags().Lookup(StoreFlag); f != nil && f.Changed {
		o.Store = f.Value.String()
	}
	if o.Log, err = logging.New(cmd.ErrOrStderr(), cfg.Log); err != nil {
		return nil, err
	}
	return node.OpenRepository(cmd.Context(), cfg, o)
}
