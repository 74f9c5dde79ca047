package bench

import (
	"context"
	"strings"
	"testing"

	"warmstart/internal/config"
)

// A learned column's learning restores each play a variant no trial plays,
// teach the manifest the pages the variants add, and its trials then miss
// fewer pages than the same policy on the recorded manifest, paired within
// blocks. On the uffd device every fault is one page, so the counts are
// exact.
func TestLearnedColumnLearnsFromItsOwnRestores(t *testing.T) {
	ctx := context.Background()
	o := Options{Device: config.DeviceUffd, Blocks: 1, ReserveBlocks: 1, Seed: 3,
		Policies: []string{"warmstart", "warmstart" + LearnedSuffix}, Drift: 0.2, Learn: 3,
		WorkDir: t.TempDir(), Progress: t.Output()}
	if err := UseReference(ctx, &o, 8<<20); err != nil {
		t.Fatal(err)
	}
	var ended []TrialResult
	o.OnTrial = func(res TrialResult) { ended = append(ended, res) }
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Summary.AllHashesOK {
		t.Fatal("a trial read wrong bytes")
	}
	if len(rep.Learning) != 1 || len(rep.Learning[0].Restores) != o.Learn {
		t.Fatalf("learning report %+v, want %d restores of one column", rep.Learning, o.Learn)
	}
	learning := rep.Learning[0]
	checkLearningVariants(t, o, ended, learning)
	if first := learning.Restores[0]; first.Missed == 0 || first.Added == 0 {
		t.Fatalf("the first learning restore missed %d and added %d pages under drift", first.Missed, first.Added)
	}
	recorded := cellOf(t, rep.Summary, Condition{CacheCold, "warmstart"}).StartupSet.MissedPages
	taught := cellOf(t, rep.Summary, Condition{CacheCold, o.Policies[1]}).StartupSet.MissedPages
	if taught >= recorded {
		t.Errorf("file-cold pages missed: %v with the learned manifest, %v with the recorded one", taught, recorded)
	}
	var table strings.Builder
	rep.WriteTable(&table)
	if !strings.Contains(table.String(), "learned minus recorded manifest") || !strings.Contains(table.String(), "learning restores missed") {
		t.Errorf("the table does not compare the learned column:\n%s", table.String())
	}
}

// checkLearningVariants: the learned column's trials prefetched the
// learned manifest, and no learning restore played a trial's variant.
func checkLearningVariants(t *testing.T, o Options, ended []TrialResult, learning LearnReport) {
	t.Helper()
	trialVariants := map[int]bool{}
	for _, res := range ended {
		trialVariants[res.Spec.Variant] = true
		if res.Spec.Condition.Prefetch == learning.Column && res.Spec.Source.Manifest.SHA256 != learning.Digest {
			t.Errorf("%s prefetched %s, not the learned manifest %s", res.Spec.Condition, res.Spec.Source.Manifest.SHA256, learning.Digest)
		}
	}
	for i, step := range learning.Restores {
		if step.Variant <= o.VariantCount() || trialVariants[step.Variant] {
			t.Errorf("learning restore %d played variant %d, which a trial plays or may play", i+1, step.Variant)
		}
	}
}

func TestLearnedColumnsAreChecked(t *testing.T) {
	if err := CheckColumn("off" + LearnedSuffix); err == nil {
		t.Error("off+learned accepted: without prefetch there is nothing to learn")
	}
	if err := CheckColumn("warmstart" + LearnedSuffix + UnverifiedSuffix); err != nil {
		t.Errorf("warmstart+learned+noverify refused: %v", err)
	}
	o := Options{Policies: []string{"seed" + LearnedSuffix}, Learn: 0}
	if err := o.validateLearn(); err == nil {
		t.Error("a learned column with --learn 0 accepted")
	}
	o.Learn = MaxLearn + 1
	if err := o.validateLearn(); err == nil {
		t.Errorf("--learn %d accepted", o.Learn)
	}
	o.Policies, o.Learn = []string{"seed"}, 0
	if err := o.validateLearn(); err != nil {
		t.Errorf("--learn 0 refused without a learned column: %v", err)
	}
	// A value no run can use is an error even where nothing learns.
	o.Learn = -1
	if err := o.validateLearn(); err == nil {
		t.Error("--learn -1 accepted without a learned column")
	}
}
