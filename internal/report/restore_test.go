package report

import (
	"strings"
	"testing"

	"warmstart/internal/api"
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
