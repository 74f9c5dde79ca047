package ops

import (
	"cmp"
	"fmt"
	"strings"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/memdev"
	"warmstart/internal/node"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
)

// CheckRestoreRequest checks what needs no configuration, before anything
// is opened (the restore verb calls it first, also with --daemon): the
// device a known kind, the I/O engine in range and not given with the
// uffd device, the prefetch mode and the policy known. Empty fields (a nil
// IOEngine) are left to RestoreOptions's defaults. Each rule has one
// message, starting with how n names the field, in a *FieldError.
func CheckRestoreRequest(req api.RestoreRequest, n Names) error {
	if req.Device != "" {
		if err := CheckDevice(req.Device, n); err != nil {
			return err
		}
	}
	if req.IOEngine != nil {
		if err := checkIOEngine(n, req.Device, *req.IOEngine); err != nil {
			return err
		}
	}
	if req.Prefetch != "" {
		if _, err := restore.ParseMode(req.Prefetch); err != nil {
			return n.fieldError("prefetch", fmt.Errorf("%s %q: want auto, on or off", n.name("prefetch"), req.Prefetch))
		}
	}
	if req.Policy != "" {
		if _, err := restore.LookupPolicy(req.Policy); err != nil {
			return n.fieldError("policy", fmt.Errorf("%s: %w", n.name("policy"), err))
		}
	}
	return nil
}

// CheckDevice refuses a device kind no restore attaches. An empty kind is
// refused too: where a caller names the device explicitly (--device ""),
// empty is no device, not the configured one.
func CheckDevice(kind string, n Names) error {
	if !config.ValidDevice(kind) {
		return n.fieldError("device", fmt.Errorf("%s %q: want %s", n.name("device"), kind, strings.Join(config.Devices(), " or ")))
	}
	return nil
}

// checkIOEngine refuses an I/O engine asked for with device: one the file
// device does not know, or any but 0 with the uffd device, which has none
// and would ignore it without a word.
func checkIOEngine(n Names, device string, ioEngine int) error {
	if !config.ValidIOEngine(ioEngine) {
		return n.fieldError("io_engine", fmt.Errorf("%s %d: want 0 or 1 (buffered) or 2 (direct I/O)", n.name("io_engine"), ioEngine))
	}
	if device == config.DeviceUffd && ioEngine != 0 {
		return n.fieldError("io_engine", fmt.Errorf("%s %d: the I/O engine is how the file device reads; the uffd device has none", n.name("io_engine"), ioEngine))
	}
	return nil
}

// RestoreOptions is CheckRestoreRequest, then the defaults from cfg for
// what req leaves out ([memory] device and io_engine, [prefetch] policy,
// prefetch auto): the options of the restore req asks for.
func RestoreOptions(cfg *config.Config, req api.RestoreRequest, n Names) (restore.Options, error) {
	if err := CheckRestoreRequest(req, n); err != nil {
		return restore.Options{}, err
	}
	device := cmp.Or(req.Device, cfg.Memory.Device)
	ioEngine := int(cfg.Memory.IOEngine)
	if req.IOEngine != nil {
		// Checked again with the configured device, which CheckRestoreRequest
		// could not know.
		if err := checkIOEngine(n, device, *req.IOEngine); err != nil {
			return restore.Options{}, err
		}
		ioEngine = *req.IOEngine
	}
	mode, err := restore.ParseMode(cmp.Or(req.Prefetch, string(restore.ModeAuto)))
	if err != nil {
		return restore.Options{}, err
	}
	policy, err := restore.LookupPolicy(cmp.Or(req.Policy, cfg.Prefetch.Policy))
	if err != nil {
		return restore.Options{}, n.fieldError("policy", fmt.Errorf("%s: %w", n.name("policy"), err))
	}
	return restore.Options{Device: device, IOEngine: ioEngine, Prefetch: mode, Policy: policy, Pausable: req.Pausable}, nil
}

// CheckDeviceBackend refuses a restore on a device whose memory backend
// the VMM cannot restore with (QEMU has no Uffd backend), in a *FieldError
// of field "device", whether the request asked for the device (given) or
// the configuration's default named it. check is the driver's answer:
// vmm.CheckBackend of a built driver, or node.CheckDriverBackend of one
// only named yet.
func CheckDeviceBackend(device string, given bool, check func(vmm.Backend) error, n Names) error {
	err := check(memdev.KindBackend(device))
	switch {
	case err == nil:
		return nil
	case given:
		return n.fieldError("device", fmt.Errorf("%s %q: %w", n.name("device"), device, err))
	}
	return n.fieldError("device", fmt.Errorf("[memory] device %q, used when %s is left out: %w; name a device this VMM can restore with",
		device, n.name("device"), err))
}

// CheckRestoreOnDriver is RestoreOptions and CheckDeviceBackend for a
// restore with the driver named driver (resolved, not auto), asked before
// the driver is built or anything opened.
func CheckRestoreOnDriver(cfg *config.Config, req api.RestoreRequest, driver string, n Names) error {
	opts, err := RestoreOptions(cfg, req, n)
	if err != nil {
		return err
	}
	check := func(b vmm.Backend) error { return node.CheckDriverBackend(driver, b) }
	return CheckDeviceBackend(opts.Device, req.Device != "", check, n)
}
