package bench

import (
	"errors"
	"fmt"
	"strings"

	"warmstart/internal/api"
	"warmstart/internal/config"
	"warmstart/internal/lab/synth"
	"warmstart/internal/layout"
	"warmstart/internal/ops"
	"warmstart/internal/restore"
)

// Flags are the bench verb's settings as given: Options plus the values
// that still need parsing or checking against each other. Check turns
// them into a run's options; its errors name the flag, and the CLI
// reports them as usage errors.
type Flags struct {
	Options
	PolicyList string
	MemorySize string
	NoHot      bool
	// Repository is posix_fs or s3 (the companion command's MinIO).
	Repository string
	Plot       string
}

// Check completes f.Options and refuses values no run can use, before
// any snapshot is synthesized or booted; it returns the reference
// snapshot's memory size. snapshot is the named snapshot, empty for the
// reference one.
func (f *Flags) Check(snapshot string) (int64, error) {
	f.Policies = splitList(f.PolicyList)
	f.Hot = !f.NoHot
	if err := CheckBlocks("blocks", f.Blocks, 1); err != nil {
		return 0, err
	}
	if err := CheckBlocks("reserve-blocks", f.ReserveBlocks, 0); err != nil {
		return 0, err
	}
	// Its range alone; validateConcurrency checks it against the VMM
	// and the columns once the snapshot is known. Options read 0 as 1,
	// but the flag offers 1..MaxConcurrency: a 0 given is refused.
	if f.Concurrency < 1 || f.Concurrency > MaxConcurrency {
		return 0, fmt.Errorf("--concurrency %d: want 1..%d", f.Concurrency, MaxConcurrency)
	}
	if err := f.checkDevice(); err != nil {
		return 0, err
	}
	if err := CheckPolicies(f.Policies); err != nil {
		return 0, fmt.Errorf("--policies: %w", err)
	}
	size, err := layout.ParseSize(f.MemorySize)
	if err != nil {
		return 0, fmt.Errorf("--memory-size: %w", err)
	}
	if err := synth.CheckMemorySize(size); snapshot == "" && err != nil {
		return 0, fmt.Errorf("--memory-size %s: %w", f.MemorySize, err)
	}
	if err := f.validateLearn(); err != nil {
		return 0, errors.New(strings.TrimPrefix(err.Error(), "bench: "))
	}
	if err := f.checkDrift(snapshot); err != nil {
		return 0, err
	}
	return size, f.checkRepository(snapshot)
}

// checkDevice refuses a --device or --io-engine no restore takes, with
// the restore verb's messages.
func (f *Flags) checkDevice() error {
	if err := ops.CheckDevice(f.Device, ops.Flags); err != nil {
		return err
	}
	return ops.CheckRestoreRequest(api.RestoreRequest{Device: f.Device, IOEngine: &f.IOEngine}, ops.Flags)
}

// checkDrift refuses a --drift no run can play: only the reference
// snapshot has drifting variants, one per trial.
func (f *Flags) checkDrift(snapshot string) error {
	if err := synth.CheckDrift(f.Drift); err != nil {
		return fmt.Errorf("--drift: %w", err)
	}
	switch {
	case f.Drift == 0:
		return nil
	case snapshot != "" || f.Repository != "posix_fs":
		return fmt.Errorf("--drift %v: only the reference snapshot (no SNAPSHOT, --repository posix_fs) has drifting variants", f.Drift)
	case f.VariantCount()+f.LearnVariants() > synth.MaxVariants:
		return fmt.Errorf("--drift %v: every trial plays its own variant, and (--blocks %d + --reserve-blocks %d) × %d conditions%s is more than %d",
			f.Drift, f.Blocks, f.ReserveBlocks, len(f.Conditions()), learningVariants(f.LearnVariants()), synth.MaxVariants)
	}
	return nil
}

// checkRepository refuses what the S3 companion cannot run.
func (f *Flags) checkRepository(snapshot string) error {
	switch f.Repository {
	case "posix_fs":
		return nil
	case "s3":
		if snapshot != "" || len(f.Policies) != 1 {
			return errors.New("--repository s3 benchmarks the reference snapshot with one --policies entry")
		}
		// It runs prefetch off and on itself, with the plain policy.
		if _, err := restore.LookupPolicy(f.Policies[0]); err != nil {
			return fmt.Errorf("--policies %s: --repository s3 takes one of %s: %w", f.Policies[0], strings.Join(restore.PolicyNames(), ", "), err)
		}
		return nil
	}
	return fmt.Errorf("--repository %q: want posix_fs or s3", f.Repository)
}

// CheckReferenceVMM refuses a --vmm the reference snapshot cannot be
// prepared for: it is the replay VMM's unless --vmm says otherwise, and
// [vmm] driver applies to a named snapshot only. Only the replay VMM
// plays drifting variants (drift above 0); a real guest drifts by itself.
func CheckReferenceVMM(snapshot, vmm string, drift float64) error {
	if snapshot == "" && vmm != "" && vmm != config.DriverReplay && vmm != config.DriverQEMU {
		return fmt.Errorf("the reference snapshot needs --vmm replay or qemu; name a snapshot for --vmm %s", vmm)
	}
	if drift > 0 && vmm != "" && vmm != config.DriverReplay {
		return fmt.Errorf("--drift %v: only the replay VMM plays drifting variants; the %s guest drifts by itself", drift, vmm)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// learningVariants names the variants learning restores add, if any.
func learningVariants(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" + %d learning restores", n)
}
