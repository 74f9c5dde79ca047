package ops

import (
	"errors"
	"fmt"

	"warmstart/internal/config"
	"warmstart/internal/memdev"
	"warmstart/internal/node"
	"warmstart/internal/vmm"
)

// CheckConfig is `config check` of cfg, loaded from file: every key
// against its range, then what Load does not read because most verbs
// never need it: the startup trace [replay] trace names, which the replay
// VMM must be able to play, and whether a driver named (not auto) can
// restore with the default device.
func CheckConfig(cfg *config.Config, file string) error {
	err := cfg.Validate()
	if err == nil && cfg.Replay.Trace != "" {
		if terr := node.CheckReplayTrace(cfg.Replay.Trace); terr != nil {
			err = config.InvalidValue("replay.trace", fmt.Errorf("%s: %w", cfg.Replay.Trace, terr))
		}
	}
	if err == nil && cfg.VMM.Driver != config.DriverAuto {
		err = CheckDefaultDevice(cfg, func(b vmm.Backend) error { return node.CheckDriverBackend(cfg.VMM.Driver, b) })
	}
	if ce := (*config.ConfigError)(nil); errors.As(err, &ce) {
		ce.File = file
	}
	return err
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
