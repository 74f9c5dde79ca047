package bench

import (
	"fmt"
	"strings"

	"warmstart/internal/restore"
)

// UnverifiedSuffix marks a column whose restores serve memory without
// checking it against the snapshot's digest table ("warmstart+noverify",
// "off+noverify"). Run beside the same column without it, it measures what
// verification costs within one run.
const UnverifiedSuffix = "+noverify"

// splitColumn returns a column's prefetch setting ("off" or a policy) and
// whether its restores skip verification.
func splitColumn(name string) (prefetch string, unverified bool) {
	base, _ := cutLearned(name)
	base, cut := strings.CutSuffix(base, UnverifiedSuffix)
	return base, cut
}

// CheckColumn refuses a column name no trial could run.
func CheckColumn(name string) error {
	base, unverified := splitColumn(name)
	if base == PrefetchOff {
		if learned(name) {
			return fmt.Errorf("column %q: without prefetch there is no manifest to learn", name)
		}
		if !unverified {
			return fmt.Errorf("column %q: prefetch off is always measured; name a policy", name)
		}
		return nil
	}
	if _, err := restore.LookupPolicy(base); err != nil {
		return fmt.Errorf("column %q: %w", name, err)
	}
	return nil
}

// policyOf returns the restore mode and policy of a column.
func policyOf(column string) (restore.Mode, restore.Policy, bool, error) {
	base, unverified := splitColumn(column)
	if base == PrefetchOff {
		return restore.ModeOff, restore.Policy{}, unverified, nil
	}
	p, err := restore.LookupPolicy(base)
	if err != nil {
		return "", restore.Policy{}, false, err
	}
	return restore.ModeOn, p, unverified, nil
}

// verificationPairs compares every unverified column with its verified
// twin, block by block, in both cache states.
func verificationPairs(columns []string, diff func(a, b Condition) Interval) []Pair {
	var pairs []Pair
	for _, col := range columns {
		base, unverified := splitColumn(col)
		if !unverified || (base != PrefetchOff && !contains(columns, base)) {
			continue
		}
		for _, cache := range []string{CacheWarm, CacheCold} {
			pairs = append(pairs, Pair{base, "file-" + cache + ": verified minus unverified",
				diff(Condition{cache, base}, Condition{cache, col})})
		}
	}
	return pairs
}

// learnedPairs compares every learned column with the same policy
// prefetching the recorded manifest, block by block, file-cold.
func learnedPairs(columns []string, diff func(a, b Condition) Interval) []Pair {
	var pairs []Pair
	for _, col := range columns {
		base, ok := cutLearned(col)
		if !ok || !contains(columns, base) {
			continue
		}
		pairs = append(pairs, Pair{base, "file-cold: learned minus recorded manifest",
			diff(Condition{CacheCold, col}, Condition{CacheCold, base})})
	}
	return pairs
}

// prefetches reports whether a column prefetches (it is not "off" with or
// without verification).
func prefetches(column string) bool {
	base, _ := splitColumn(column)
	return base != PrefetchOff
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
