package report

import (
	"strings"
	"testing"
	"time"

	"warmstart/internal/api"
	"warmstart/internal/procstat"
	"warmstart/internal/restore"
)

// TestRestoreSaysWhatThePlanTookAlong: a restore whose plan read small
// gaps beyond its manifest says so next to the manifest's planned bytes,
// and one that read none says nothing of gaps.
func TestRestoreSaysWhatThePlanTookAlong(t *testing.T) {
	for _, tc := range []struct {
		gap  int64
		want string
	}{
		{0, ", 40.0 MiB planned, policy warmstart"},
		{8_912_896, ", 40.0 MiB planned (+8.5 MiB of small gaps taken along), policy warmstart"},
	} {
		var b strings.Builder
		Restore(&b, api.RestoreInfo{Policy: "warmstart", Prefetch: restore.PrefetchReport{
			State: "completed", PlannedBytes: 40 << 20, GapBytes: tc.gap}})
		if !strings.Contains(b.String(), "prefetch            completed"+tc.want) {
			t.Errorf("gap %d bytes: printed\n%s\nwant a prefetch line ending %q", tc.gap, b.String(), tc.want)
		}
	}
}

// TestRestorePrintsItsCostAndSaysWhenItWasServedUnchecked: the cost
// account until ready is one line; a passthrough restore says no block
// was checked, and one served by the device says nothing of it.
func TestRestorePrintsItsCostAndSaysWhenItWasServedUnchecked(t *testing.T) {
	cost := restore.Cost{Node: procstat.Usage{User: 20 * time.Millisecond, System: 60 * time.Millisecond, StorageReadBytes: 48 << 20},
		VMM: &procstat.Usage{User: 90 * time.Millisecond, System: 10 * time.Millisecond}, CopiedBytes: 96 << 20}
	var b strings.Builder
	Restore(&b, api.RestoreInfo{Cost: cost})
	want := "cost until ready    node CPU 80.0 ms (user 20.0, system 60.0), VMM CPU 100.0 ms, VMM major faults 0, 48.0 MiB read from storage, 96.0 MiB copied"
	if !strings.Contains(b.String(), want) || strings.Contains(b.String(), "passthrough") {
		t.Errorf("printed\n%s\nwant the line %q and no passthrough", b.String(), want)
	}
	b.Reset()
	Restore(&b, api.RestoreInfo{Passthrough: true})
	if !strings.Contains(b.String(), "FUSE passthrough: the kernel served the lower file, no block checked") {
		t.Errorf("a passthrough restore printed\n%s", b.String())
	}
}
