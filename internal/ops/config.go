package ops

import (
	"errors"
	"fmt"

	"warmstart/internal/config"
	"warmstart/internal/memdev"
	"warmstart/internal/node"
	"warmstart/internal/repository/s3"
	"warmstart/internal/trust"
	"warmstart/internal/vmm"
)

// CheckConfig is `config check` of cfg, loaded from file: every key
// against its range, then what Load does not read because most verbs
// never need it: the startup trace [replay] trace names, which the replay
// VMM must be able to play, the [trust] key files, and whether a driver
// named (not auto) can restore with the default device.
func CheckConfig(cfg *config.Config, file string) error {
	err := cfg.Validate()
	if err == nil && cfg.Replay.Trace != "" {
		if terr := node.CheckReplayTrace(cfg.Replay.Trace); terr != nil {
			err = config.InvalidValue("replay.trace", fmt.Errorf("%s: %w", cfg.Replay.Trace, terr))
		}
	}
	if err == nil {
		err = checkTrustKeys(cfg)
	}
	if err == nil && cfg.Snapshot.RepositoryBackend == config.BackendS3 {
		err = checkS3Address(cfg.Backend.S3)
	}
	if err == nil && cfg.VMM.Driver != config.DriverAuto {
		err = CheckDefaultDevice(cfg, func(b vmm.Backend) error { return node.CheckDriverBackend(cfg.VMM.Driver, b) })
	}
	if ce := (*config.ConfigError)(nil); errors.As(err, &ce) {
		ce.File = file
	}
	return err
}

// checkTrustKeys reads the key files of [trust] as every verb that signs
// or restores and the daemon read them: a file that fails there fails
// the check, naming the key.
func checkTrustKeys(cfg *config.Config) error {
	if cfg.Trust.SigningKey != "" {
		if _, err := trust.LoadPrivate(cfg.Trust.SigningKey); err != nil {
			return config.InvalidValue("trust.signing_key", err)
		}
	}
	if _, err := trust.LoadPolicy(cfg.Trust.TrustedKeys, nil); err != nil {
		return config.InvalidValue("trust.trusted_keys", err)
	}
	return nil
}

// checkS3Address refuses the endpoint and prefix the S3 repository
// refuses when a verb opens it.
func checkS3Address(c config.S3Config) error {
	if err := s3.CheckEndpoint(c.Endpoint); err != nil {
		return config.InvalidValue("backend.s3.endpoint", err)
	}
	if err := s3.CheckPrefix(c.Prefix); err != nil {
		return config.InvalidValue("backend.s3.prefix", err)
	}
	return nil
}

// CheckDefaultDevice refuses a [memory] device the VMM cannot restore
// with (QEMU has no uffd backend): every restore that names no device
// would be refused, so the configuration is wrong, not the request.
// check is the driver's answer (node.CheckDriverBackend, vmm.CheckBackend).
func CheckDefaultDevice(cfg *config.Config, check func(vmm.Backend) error) error {
	if err := check(memdev.KindBackend(cfg.Memory.Device)); err != nil {
		return config.InvalidValue("memory.device", fmt.Errorf("%q with [vmm] driver %q: %w", cfg.Memory.Device, cfg.VMM.Driver, err))
	}
	return nil
}
