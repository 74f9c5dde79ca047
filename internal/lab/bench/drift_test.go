package bench

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/startupset"
)

func driftOptions(drift float64) Options {
	o := benchOptions(1)
	o.TracePath, o.Drift = "base.trace", drift
	for k := 1; k <= o.VariantCount(); k++ {
		o.Variants = append(o.Variants, fmt.Sprintf("variant-%d.trace", k))
	}
	return o
}

// TestTrialTraceWithoutDriftIsTheBase: drift 0 plays the base trace in
// every trial, as before drift existed.
func TestTrialTraceWithoutDriftIsTheBase(t *testing.T) {
	o := driftOptions(0)
	for b := -1; b < o.Blocks+o.ReserveBlocks; b++ {
		for _, c := range o.Conditions() {
			if path, k := o.TrialTrace(b, c); path != "base.trace" || k != 0 {
				t.Fatalf("block %d %s plays %s (variant %d) at drift 0", b, c, path, k)
			}
		}
	}
}

// TestTrialTraceGivesEveryTrialItsVariant: with drift, every trial of
// every formal and reserve block plays a variant of its own, the same for
// the same block and condition whatever the block's order.
func TestTrialTraceGivesEveryTrialItsVariant(t *testing.T) {
	o := driftOptions(0.2)
	seen := map[string]string{}
	for b := 0; b < o.Blocks+o.ReserveBlocks; b++ {
		for _, c := range o.Orders()[b] {
			path, k := o.TrialTrace(b, c)
			trial := fmt.Sprintf("block %d %s", b, c)
			if k < 1 || path != o.Variants[k-1] {
				t.Fatalf("%s plays %s, variant %d", trial, path, k)
			}
			if other, dup := seen[path]; dup {
				t.Errorf("%s and %s both play %s", other, trial, path)
			}
			seen[path] = trial
			if again, _ := o.TrialTrace(b, c); again != path {
				t.Errorf("%s plays %s, then %s", trial, path, again)
			}
		}
	}
	if len(seen) != o.VariantCount() {
		t.Errorf("%d trials played variants, VariantCount says %d", len(seen), o.VariantCount())
	}
	if path, k := o.TrialTrace(-1, Condition{CacheWarm, PrefetchOff}); path != o.TracePath || k != 0 {
		t.Errorf("the pilot plays %s (variant %d), want the base", path, k)
	}
}

func TestValidateRefusesDriftWithoutItsVariants(t *testing.T) {
	o := driftOptions(0.2)
	o.Source.Manifest = nil
	o.Variants = o.Variants[:3]
	if err := o.validateDrift(); err == nil || !strings.Contains(err.Error(), "3 variants") {
		t.Errorf("3 variants for %d trials: %v", o.VariantCount(), err)
	}
	o = driftOptions(0.2)
	o.VMM = config.DriverQEMU
	if err := o.validateDrift(); err == nil || !strings.Contains(err.Error(), "replay VMM") {
		t.Errorf("drift on qemu: %v", err)
	}
	if o := driftOptions(1.5); o.validateDrift() == nil {
		t.Error("drift 1.5 accepted")
	}
}

func TestFlagsCheckDrift(t *testing.T) {
	for _, c := range []struct {
		snapshot string
		edit     func(*Flags)
		want     string
	}{
		{"", func(f *Flags) { f.Drift = -0.1 }, "--drift: drift -0.1"},
		{"", func(f *Flags) { f.Drift = 2 }, "--drift: drift 2"},
		{"snap", func(f *Flags) { f.Drift = 0.2 }, "only the reference snapshot"},
		{"", func(f *Flags) { f.Drift, f.Repository, f.PolicyList = 0.2, "s3", "seed" }, "only the reference snapshot"},
		{"", func(f *Flags) { f.Drift, f.Blocks = 0.2, 200 }, "--drift 0.2: every trial plays its own variant"},
	} {
		f := validFlags()
		c.edit(&f)
		if _, err := f.Check(c.snapshot); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want %q, got %v", c.want, err)
		}
	}
	f := validFlags()
	f.Drift = 0.2
	if _, err := f.Check(""); err != nil {
		t.Errorf("--drift 0.2 on the reference snapshot: %v", err)
	}
	if err := CheckReferenceVMM("", config.DriverQEMU, 0.2); err == nil || !strings.Contains(err.Error(), "--drift 0.2") {
		t.Errorf("--drift on the qemu guest: %v", err)
	}
}

// TestSummaryAveragesTheStartupSet: each cell carries the mean startup-set
// outcome of its admitted trials, and the table prints it per policy.
func TestSummaryAveragesTheStartupSet(t *testing.T) {
	o := Options{Blocks: 2, Policies: []string{"seed"}}
	trials := trialsOf(map[Condition][]float64{warmOff: {10, 10}, coldOff: {30, 30}, warmSeed: {8, 8}, coldSeed: {20, 20}})
	for i := range trials {
		if trials[i].Spec.Condition == coldSeed {
			b := int64(trials[i].Spec.Block)
			trials[i].StartupSet = startupset.Report{StartupSetPages: 1000, InTimePages: 900 + 20*b, LatePages: 60 - 20*b,
				UnusedPages: 40, MissedPages: 10 + 20*b}
		}
	}
	missed := missedTrial(1, coldSeed)
	missed.StartupSet.MissedPages = 1e6
	rep := &Report{Options: ReportOptions{Blocks: 2, Policies: o.Policies, Drift: 0.2}, Summary: summarize(o, append(trials, missed))}
	got := cellOf(t, rep.Summary, coldSeed).StartupSet
	want := StartupSetMeans{InTimePages: 910, LatePages: 50, UnusedPages: 40, MissedPages: 20, MissedPercent: 2}
	if got != want {
		t.Errorf("cold seed startup set %+v, want %+v", got, want)
	}
	var out bytes.Buffer
	rep.WriteTable(&out)
	table := out.String()
	if !strings.Contains(table, ", drift 0.20 (") {
		t.Errorf("the header does not say the run drifts:\n%s", table)
	}
	if got := fieldsOfLine(table[strings.Index(table, "startup-set pages"):], "file-cold"); got != "file-cold 0 / 0 / 0 910 / 50 / 40" {
		t.Errorf("startup-set row %q:\n%s", got, table)
	}
	if got := fieldsOfLine(table[strings.Index(table, "pages missed"):], "file-cold"); got != "file-cold 0 (0.0%) 20 (2.0%)" {
		t.Errorf("missed row %q:\n%s", got, table)
	}
}

// A policy named twice would run its column twice and report one of them.
func TestValidateRefusesAPolicyNamedTwice(t *testing.T) {
	o := driftOptions(0)
	o.Policies = []string{"warmstart", "seed", "warmstart"}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "warmstart is named twice") {
		t.Errorf("--policies warmstart,seed,warmstart: %v", err)
	}
}
