package bench

import (
	"testing"

	"warmstart/internal/restore"
)

func TestColumnsNameAPolicyOrOffWithVerificationSwitch(t *testing.T) {
	for _, ok := range []string{"warmstart", "seed", "warmstart+noverify", "off+noverify"} {
		if err := CheckColumn(ok); err != nil {
			t.Errorf("CheckColumn(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"off", "nope", "nope+noverify", "warmstart+noverify+noverify", "+noverify"} {
		if err := CheckColumn(bad); err == nil {
			t.Errorf("CheckColumn(%q) accepted", bad)
		}
	}
	mode, p, unverified, err := policyOf("warmstart+noverify")
	if err != nil || mode != restore.ModeOn || p.Name != "warmstart" || !unverified {
		t.Errorf("policyOf(warmstart+noverify) = %v %q %v %v", mode, p.Name, unverified, err)
	}
	mode, _, unverified, err = policyOf("off+noverify")
	if err != nil || mode != restore.ModeOff || !unverified {
		t.Errorf("policyOf(off+noverify) = %v %v %v", mode, unverified, err)
	}
}

func TestVerificationPairsCompareEachUnverifiedColumnWithItsTwin(t *testing.T) {
	var compared [][2]Condition
	diff := func(a, b Condition) Interval {
		compared = append(compared, [2]Condition{a, b})
		return Interval{}
	}
	pairs := verificationPairs([]string{"warmstart", "warmstart+noverify", "off+noverify", "seed+noverify"}, diff)
	// seed+noverify has no verified twin among the columns: no pair.
	if len(pairs) != 4 || len(compared) != 4 {
		t.Fatalf("%d pairs, want 4 (warmstart and off, warm and cold)", len(pairs))
	}
	want := [][2]Condition{
		{{CacheWarm, "warmstart"}, {CacheWarm, "warmstart+noverify"}},
		{{CacheCold, "warmstart"}, {CacheCold, "warmstart+noverify"}},
		{{CacheWarm, PrefetchOff}, {CacheWarm, "off+noverify"}},
		{{CacheCold, PrefetchOff}, {CacheCold, "off+noverify"}},
	}
	for i := range want {
		if compared[i] != want[i] {
			t.Errorf("pair %d compares %v, want %v", i, compared[i], want[i])
		}
	}
}
