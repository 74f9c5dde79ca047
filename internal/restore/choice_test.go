package restore

import (
	"errors"
	"testing"

	"warmstart/internal/config"
)

// TestOptionsForFillsFromConfigAndNamesBadFields: an empty choice takes
// the configuration's device, policy and io_engine and prefetch auto; a
// given value wins; a bad value is a *FieldError naming its field.
func TestOptionsForFillsFromConfigAndNamesBadFields(t *testing.T) {
	cfg := config.Default()
	cfg.Memory.Device, cfg.Memory.IOEngine, cfg.Prefetch.Policy = config.DeviceUffd, 1, config.PolicyWarmstart
	o, err := OptionsFor(cfg, Choice{})
	if err != nil || o.Device != config.DeviceUffd || o.IOEngine != 1 || o.Prefetch != ModeAuto || o.Policy.Name != config.PolicyWarmstart {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
	zero := 0
	o, err = OptionsFor(cfg, Choice{Device: config.DeviceFile, Prefetch: "off", Policy: "seed", IOEngine: &zero})
	if err != nil || o.Device != config.DeviceFile || o.IOEngine != 0 || o.Prefetch != ModeOff || o.Policy.Name != "seed" {
		t.Fatalf("given: %+v, %v", o, err)
	}
	three := 3
	for field, c := range map[string]Choice{
		"device": {Device: "disk"}, "prefetch": {Prefetch: "sometimes"},
		"policy": {Policy: "nope"}, "io_engine": {IOEngine: &three},
	} {
		_, err := OptionsFor(cfg, c)
		if fe := (*FieldError)(nil); !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: got %v, want a FieldError naming it", field, err)
		}
	}
}

// TestCheckFlagsNamesTheFlag: each refused restore flag is named; empty
// device and policy mean the configured defaults and pass.
func TestCheckFlagsNamesTheFlag(t *testing.T) {
	if err := CheckFlags("", 2, ""); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	for want, err := range map[string]error{
		"--device": CheckFlags("disk", 0, ""), "--io-engine": CheckFlags("", 7, ""), "--policy": CheckFlags("", 0, "nope"),
		"--io-engine 2": CheckFlags(config.DeviceUffd, 2, ""),
	} {
		if err == nil || len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
			t.Errorf("%s: got %v", want, err)
		}
	}
}

// TestOptionsForTakesUffdOnS3: the uffd device serves any memory, an S3
// snapshot's included.
func TestOptionsForTakesUffdOnS3(t *testing.T) {
	cfg := config.Default()
	cfg.Snapshot.RepositoryBackend = config.BackendS3
	for _, device := range []string{config.DeviceUffd, config.DeviceFile} {
		if _, err := OptionsFor(cfg, Choice{Device: device}); err != nil {
			t.Errorf("%s on s3: %v", device, err)
		}
	}
}

// TestOptionsForRefusesAnIOEngineForUffd: an I/O engine is how the file
// device reads; asked for with the uffd device it would be silently
// ignored, so a non-zero one is refused, naming the field. The node's
// configured engine, which is for its file-device restores, is not.
func TestOptionsForRefusesAnIOEngineForUffd(t *testing.T) {
	cfg := config.Default()
	cfg.Memory.IOEngine = 2
	if _, err := OptionsFor(cfg, Choice{Device: config.DeviceUffd}); err != nil {
		t.Fatalf("uffd with the configured engine: %v", err)
	}
	two, zero := 2, 0
	_, err := OptionsFor(cfg, Choice{Device: config.DeviceUffd, IOEngine: &two})
	if fe := (*FieldError)(nil); !errors.As(err, &fe) || fe.Field != "io_engine" {
		t.Fatalf("uffd with io_engine 2: got %v, want a FieldError naming io_engine", err)
	}
	if _, err := OptionsFor(cfg, Choice{Device: config.DeviceUffd, IOEngine: &zero}); err != nil {
		t.Fatalf("uffd with io_engine 0: %v", err)
	}
}
