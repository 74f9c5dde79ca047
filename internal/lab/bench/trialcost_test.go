package bench

import (
	"testing"

	"warmstart/internal/memdev"
	"warmstart/internal/restore"
)

// TestTrialCostCountsASharedDeviceOnce: concurrent restores of one
// snapshot on the file device share its generation, whose counters each
// restore reads over its own window (acquisition to ready), so each
// window holds the others' reads too. The trial's bytes read are then
// the longest window's, not their sum; restores on devices of their own
// (uffd, one per VM) add up.
func TestTrialCostCountsASharedDeviceOnce(t *testing.T) {
	inst := func(gen, read uint64) *restore.Instance {
		return &restore.Instance{Generation: gen, DeviceBytes: memdev.Counters{BytesRead: read},
			Cost: restore.Cost{LowerBytesRead: read, CopiedBytes: memdev.CopiesPerByteRead * read}}
	}
	for _, c := range []struct {
		name  string
		insts []*restore.Instance
		want  uint64
	}{
		{"one shared generation", []*restore.Instance{inst(7, 100<<10), inst(7, 120<<10)}, 120 << 10},
		{"a device each", []*restore.Instance{inst(7, 100<<10), inst(8, 120<<10)}, 220 << 10},
		{"two shared, one own", []*restore.Instance{inst(7, 100<<10), inst(7, 90<<10), inst(9, 10<<10)}, 110 << 10},
	} {
		got := trialCost(c.insts)
		if got.LowerBytesRead != c.want || got.CopiedBytes != memdev.CopiesPerByteRead*c.want {
			t.Errorf("%s: bytes read %d, copied %d; want %d, %d", c.name, got.LowerBytesRead, got.CopiedBytes,
				c.want, memdev.CopiesPerByteRead*c.want)
		}
	}
}
