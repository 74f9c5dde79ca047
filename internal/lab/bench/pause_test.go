package bench

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"warmstart/internal/api/apitest"
	"warmstart/internal/pause"
)

// TestPauseTableRows: the table prints every row with its median, range
// and count, the ratio as a ratio, and the load around the run.
func TestPauseTableRows(t *testing.T) {
	r := &PauseReport{MemoryMiB: 256, WriteMiB: 16, Accel: "tcg", LoadBefore: "1.00 1.00 1.00", LoadAfter: "2.00 2.00 2.00"}
	for i := range 3 {
		r.Samples = append(r.Samples, PauseSample{Cycle: i, WrittenBytes: 16 << 20, StoredBytes: 16<<20 + int64(i)<<20,
			ResumeNs: time.Second, Timings: pause.Timings{Paused: time.Duration(100+i) * time.Millisecond, Total: 400 * time.Millisecond}})
	}
	var b strings.Builder
	r.WriteTable(&b)
	out := b.String()
	for _, want := range []string{
		"256 MiB guest, 16 MiB written per cycle, 3 cycles, load 1.00 1.00 1.00 → 2.00 2.00 2.00",
		"VM paused                               101ms      100ms      102ms    3",
		"pause → child published                 400ms      400ms      400ms    3  ≤ 1000 ms",
		"child bytes / written bytes             1.062      1.000      1.125    3  ≤ 1.10",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestPauseReportJSONFollowsTheConvention: the pause bench's JSON gives
// sizes in bytes and durations in integer nanoseconds (docs/json.md).
func TestPauseReportJSONFollowsTheConvention(t *testing.T) {
	r := &PauseReport{MemoryMiB: 256, WriteMiB: 16, Accel: "tcg", Samples: []PauseSample{{Cycle: 1, ResumeNs: time.Second}}}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	apitest.CheckConvention(t, "pause bench report", data)
	var doc struct {
		MemoryBytes int64 `json:"memory_bytes"`
		WriteBytes  int64 `json:"write_bytes"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.MemoryBytes != 256<<20 || doc.WriteBytes != 16<<20 {
		t.Errorf("memory_bytes %d, write_bytes %d; want %d and %d: %s", doc.MemoryBytes, doc.WriteBytes, 256<<20, 16<<20, data)
	}
}
