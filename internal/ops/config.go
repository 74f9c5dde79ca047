package ops

import (
	"errors"
	"fmt"

	"warmstart/internal/config"
	"warmstart/internal/node"
)

// CheckConfig is `config check` of cfg, loaded from file: every key
// against its range, then what Load does not read because most verbs
// never need it, the startup trace [replay] trace names, which the replay
// VMM must be able to play.
func CheckConfig(cfg *config.Config, file string) error {
	err := cfg.Validate()
	if err == nil && cfg.Replay.Trace != "" {
		if terr := node.CheckReplayTrace(cfg.Replay.Trace); terr != nil {
			err = config.InvalidValue("replay.trace", fmt.Errorf("%s: %w", cfg.Replay.Trace, terr))
		}
	}
	if ce := (*config.ConfigError)(nil); errors.As(err, &ce) {
		ce.File = file
	}
	return err
}
