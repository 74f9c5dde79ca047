package ops_test

import (
	"errors"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/ops"
	"warmstart/internal/restore"
)

// TestEveryRestoreRuleHasOneMessage: each rule refuses its value in the
// field it belongs to, with the one message of the rule, named as the
// caller names the field: by its flag for the CLI, by its JSON name for
// the daemon.
func TestEveryRestoreRuleHasOneMessage(t *testing.T) {
	seven, two, minus := 7, 2, -1
	for _, tc := range []struct {
		rule      string
		req       api.RestoreRequest
		field     string
		flag, api string
	}{
		{"unknown device", api.RestoreRequest{Device: "nvme"},
			"device", `--device "nvme": want file or uffd`, `device "nvme": want file or uffd`},
		{"engine out of range", api.RestoreRequest{IOEngine: &seven},
			"io_engine", "--io-engine 7: want 0 or 1 (buffered) or 2 (direct I/O)", "io_engine 7: want 0 or 1 (buffered) or 2 (direct I/O)"},
		{"negative engine", api.RestoreRequest{IOEngine: &minus},
			"io_engine", "--io-engine -1: want 0 or 1 (buffered) or 2 (direct I/O)", "io_engine -1: want 0 or 1 (buffered) or 2 (direct I/O)"},
		{"engine with uffd", api.RestoreRequest{Device: "uffd", IOEngine: &two},
			"io_engine", "--io-engine 2: the I/O engine is how the file device reads; the uffd device has none",
			"io_engine 2: the I/O engine is how the file device reads; the uffd device has none"},
		{"unknown prefetch mode", api.RestoreRequest{Prefetch: "maybe"},
			"prefetch", `--prefetch "maybe": want auto, on or off`, `prefetch "maybe": want auto, on or off`},
		{"unknown policy", api.RestoreRequest{Policy: "fastest"},
			"policy", `--policy: unknown prefetch policy "fastest" (known: e2b, reap, seed, warmstart)`,
			`policy: unknown prefetch policy "fastest" (known: e2b, reap, seed, warmstart)`},
	} {
		for _, naming := range []struct {
			names ops.Names
			want  string
		}{{ops.Flags, tc.flag}, {ops.JSONFields, tc.api}} {
			for _, check := range []func() error{
				func() error { return ops.CheckRestoreRequest(tc.req, naming.names) },
				func() error { _, err := ops.RestoreOptions(config.Default(), tc.req, naming.names); return err },
			} {
				err := check()
				var fe *ops.FieldError
				if !errors.As(err, &fe) || fe.Field != tc.field || err.Error() != naming.want {
					t.Errorf("%s: %v, want field %s and %q", tc.rule, err, tc.field, naming.want)
				}
			}
		}
	}
}

// TestRestoreOptionsFillsFromConfig: an empty request takes the
// configuration's device, policy and io_engine and prefetch auto; a given
// value wins.
func TestRestoreOptionsFillsFromConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Memory.Device, cfg.Memory.IOEngine, cfg.Prefetch.Policy = config.DeviceUffd, 1, config.PolicyWarmstart
	o, err := ops.RestoreOptions(cfg, api.RestoreRequest{}, ops.JSONFields)
	if err != nil || o.Device != config.DeviceUffd || o.IOEngine != 1 || o.Prefetch != restore.ModeAuto || o.Policy.Name != config.PolicyWarmstart {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
	zero := 0
	o, err = ops.RestoreOptions(cfg, api.RestoreRequest{Device: config.DeviceFile, Prefetch: "off", Policy: "seed", IOEngine: &zero}, ops.JSONFields)
	if err != nil || o.Device != config.DeviceFile || o.IOEngine != 0 || o.Prefetch != restore.ModeOff || o.Policy.Name != "seed" {
		t.Fatalf("given: %+v, %v", o, err)
	}
}

// TestAnEngineIsRefusedWithTheConfiguredUffdDevice: an I/O engine given
// without a device is checked against the configured one, which only
// RestoreOptions knows; the configured engine is never refused.
func TestAnEngineIsRefusedWithTheConfiguredUffdDevice(t *testing.T) {
	cfg := config.Default()
	cfg.Memory.Device, cfg.Memory.IOEngine = config.DeviceUffd, 2
	two := 2
	if err := ops.CheckRestoreRequest(api.RestoreRequest{IOEngine: &two}, ops.Flags); err != nil {
		t.Fatalf("CheckRestoreRequest knows no configured device: %v", err)
	}
	_, err := ops.RestoreOptions(cfg, api.RestoreRequest{IOEngine: &two}, ops.Flags)
	if fe := (*ops.FieldError)(nil); !errors.As(err, &fe) || fe.Field != "io_engine" {
		t.Fatalf("io_engine 2 with the configured uffd device: %v", err)
	}
	if _, err := ops.RestoreOptions(cfg, api.RestoreRequest{}, ops.Flags); err != nil {
		t.Fatalf("the configured engine with the configured device: %v", err)
	}
}

// TestRestoreOptionsTakesUffdOnS3: the uffd device serves any memory, an
// S3 snapshot's included.
func TestRestoreOptionsTakesUffdOnS3(t *testing.T) {
	cfg := config.Default()
	cfg.Snapshot.RepositoryBackend = config.BackendS3
	for _, device := range []string{config.DeviceUffd, config.DeviceFile} {
		if _, err := ops.RestoreOptions(cfg, api.RestoreRequest{Device: device}, ops.JSONFields); err != nil {
			t.Errorf("%s on s3: %v", device, err)
		}
	}
}

// TestDeviceTheDriverCannotUse: QEMU has no Uffd backend, so a restore on
// the uffd device with it is refused in field device, named as the caller
// named it, or as [memory] device when the default chose it; the other
// drivers take both devices, and QEMU the file device.
func TestDeviceTheDriverCannotUse(t *testing.T) {
	const why = `memory backend not supported by the QEMU driver: "Uffd" (only "File")`
	uffdCfg := config.Default()
	uffdCfg.Memory.Device = config.DeviceUffd
	for _, tc := range []struct {
		name   string
		cfg    *config.Config
		req    api.RestoreRequest
		driver string
		n      ops.Names
		want   string // "": accepted
	}{
		{"asked for, flag", config.Default(), api.RestoreRequest{Device: config.DeviceUffd}, config.DriverQEMU, ops.Flags, `--device "uffd": ` + why},
		{"asked for, API", config.Default(), api.RestoreRequest{Device: config.DeviceUffd}, config.DriverQEMU, ops.JSONFields, `device "uffd": ` + why},
		{"configured", uffdCfg, api.RestoreRequest{}, config.DriverQEMU, ops.JSONFields,
			`[memory] device "uffd", used when device is left out: ` + why + "; name a device this VMM can restore with"},
		{"file on qemu", uffdCfg, api.RestoreRequest{Device: config.DeviceFile}, config.DriverQEMU, ops.JSONFields, ""},
		{"uffd on replay", uffdCfg, api.RestoreRequest{}, config.DriverReplay, ops.JSONFields, ""},
		{"uffd on firecracker", config.Default(), api.RestoreRequest{Device: config.DeviceUffd}, config.DriverFirecracker, ops.Flags, ""},
	} {
		err := ops.CheckRestoreOnDriver(tc.cfg, tc.req, tc.driver, tc.n)
		var fe *ops.FieldError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want accepted", tc.name, err)
		case tc.want != "" && (!errors.As(err, &fe) || fe.Field != "device" || err.Error() != tc.want):
			t.Errorf("%s: %v (%T), want a FieldError of device: %s", tc.name, err, err, tc.want)
		}
	}
}
