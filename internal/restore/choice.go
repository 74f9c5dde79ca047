package restore

import (
	"cmp"
	"fmt"

	"warmstart/internal/config"
)

// Choice is what a caller asks of one restore: the daemon's request body
// or the restore verb's flags. An empty field (a nil IOEngine) takes the
// configuration's value, so both callers fill defaults the same way.
type Choice struct {
	Device, Prefetch, Policy string
	IOEngine                 *int
}

// FieldError names the field of a Choice a value was refused in, so the
// daemon can answer 400 naming it and the CLI can exit 2.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// OptionsFor checks c, fills what it leaves out from cfg, and returns the
// restore's options.
func OptionsFor(cfg *config.Config, c Choice) (Options, error) {
	device := cmp.Or(c.Device, cfg.Memory.Device)
	if !config.ValidDevice(device) {
		return Options{}, &FieldError{"device", fmt.Errorf("unknown memory device %q (want %s or %s)", device, config.DeviceFile, config.DeviceUffd)}
	}
	mode, err := ParseMode(cmp.Or(c.Prefetch, string(ModeAuto)))
	if err != nil {
		return Options{}, &FieldError{"prefetch", err}
	}
	policy, err := LookupPolicy(cmp.Or(c.Policy, cfg.Prefetch.Policy))
	if err != nil {
		return Options{}, &FieldError{"policy", err}
	}
	ioEngine := cfg.Memory.IOEngine
	if c.IOEngine != nil {
		ioEngine = *c.IOEngine
	}
	if !config.ValidIOEngine(ioEngine) {
		return Options{}, &FieldError{"io_engine", fmt.Errorf("io_engine %d: want 0, 1 or 2", ioEngine)}
	}
	if c.IOEngine != nil && device == config.DeviceUffd && ioEngine != 0 {
		return Options{}, &FieldError{"io_engine", uffdIOEngineError("io_engine", ioEngine)}
	}
	return Options{Device: device, IOEngine: ioEngine, Prefetch: mode, Policy: policy}, nil
}

// uffdIOEngineError refuses an I/O engine asked for with the uffd device,
// which has none: it would be ignored without a word.
// name is the field or flag that asked.
func uffdIOEngineError(name string, ioEngine int) error {
	return fmt.Errorf("%s %d: the I/O engine is how the file device reads; the uffd device has none", name, ioEngine)
}

// The checks below refuse flag values no restore can use while that is
// still cheap: before a verb opens a repository, mounts a memory device or
// starts a VMM, so that a typo leaves nothing behind, not a failure
// halfway through. Their errors name the flag; the CLI reports them as
// usage errors.

// CheckFlags checks the restore verb's --device, --io-engine and
// --policy. Empty device and policy mean the configured defaults.
func CheckFlags(device string, ioEngine int, policy string) error {
	if device != "" && !config.ValidDevice(device) {
		return fmt.Errorf("--device %q: want file or uffd", device)
	}
	if err := CheckIOEngineFor(device, ioEngine); err != nil {
		return err
	}
	if policy != "" {
		if _, err := LookupPolicy(policy); err != nil {
			return fmt.Errorf("--policy: %w", err)
		}
	}
	return nil
}

// CheckIOEngineFor checks an --io-engine value asked for with device: a
// known engine, and none but 0 with the uffd device, which has none.
func CheckIOEngineFor(device string, n int) error {
	if err := CheckIOEngineFlag(n); err != nil {
		return err
	}
	if device == config.DeviceUffd && n != 0 {
		return uffdIOEngineError("--io-engine", n)
	}
	return nil
}

// CheckIOEngineFlag checks an --io-engine value: the memory device knows
// engines 0 and 1 (buffered) and 2 (direct I/O).
func CheckIOEngineFlag(n int) error {
	if !config.ValidIOEngine(n) {
		return fmt.Errorf("--io-engine %d: want 0 or 1 (buffered) or 2 (direct I/O)", n)
	}
	return nil
}
