package bench

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"warmstart/internal/config"
)

// TestRunProfilesAndAccountsEveryTimedRestore runs one block on the file
// device with --cpuprofile: every formal trial leaves a CPU profile of its
// timed restore under its own name, and carries the restore's cost.
func TestRunProfilesAndAccountsEveryTimedRestore(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "profiles")
	o := Options{Device: config.DeviceFile, Blocks: 1, ReserveBlocks: 1, Seed: 5, Policies: []string{"warmstart"},
		Hot: true, WorkDir: t.TempDir(), Progress: t.Output(), CPUProfileDir: dir}
	if err := UseReference(ctx, &o, 8<<20); err != nil {
		t.Fatal(err)
	}
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Trials {
		c := res.Spec.Condition
		if res.Spec.Block < 0 {
			continue
		}
		st, err := os.Stat(filepath.Join(dir, ProfileName(res.Spec.Block, res.Spec.Reserve, c)))
		if err != nil || st.Size() == 0 {
			t.Errorf("%s: no profile (%v)", c, err)
		}
		if res.Cost.Node.CPU() <= 0 || res.Cost.VMM == nil || res.Cost.VMM.CPU() <= 0 {
			t.Errorf("%s: cost %+v, want the node's and the VMM's CPU", c, res.Cost)
		}
	}
	if len(rep.Trials) < len(o.Conditions()) {
		t.Fatalf("%d trials for %d conditions", len(rep.Trials), len(o.Conditions()))
	}
}
