package bench

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"warmstart/internal/api/apitest"
	"warmstart/internal/layers"
	"warmstart/internal/manifest"
	"warmstart/internal/pause"
)

func pauseReportForTable() *PauseReport {
	r := &PauseReport{MemoryMiB: 256, WriteMiB: 16, Accel: "tcg", LoadBefore: "1.00 1.00 1.00", LoadAfter: "2.00 2.00 2.00",
		CyclesCorrect: 3, ChainVerified: true}
	for i := range 3 {
		// 4096 pages written, 96 of them back equal: 4000 differ.
		r.Samples = append(r.Samples, PauseSample{Cycle: i, WrittenBytes: 16 << 20, StoredBytes: 16<<20 + int64(i)<<20,
			Pages:    layers.Counts{Candidates: 4096, Identical: 96, Stored: 4000},
			ResumeNs: time.Second, Timings: pause.Timings{Paused: time.Duration(100+i) * time.Millisecond,
				Freeze: 100 * time.Millisecond, Layer: 300 * time.Millisecond, Publish: 50 * time.Millisecond, Total: 400 * time.Millisecond}})
	}
	r.Resume = &ResumeReport{Depth: 3, FlatDepth: 1, Policy: "warmstart", Rejected: 1,
		Harvested: ManifestFacts{Pages: 512, Bytes: 2 << 20, Ranges: 7}, Recorded: ManifestFacts{Pages: 256, Bytes: 1 << 20, Ranges: 5},
		CommonPages: 256, Jaccard: 0.5}
	for i := range 2 {
		ms := func(v int) time.Duration { return time.Duration(v+10*i) * time.Millisecond }
		r.Resume.Trials = append(r.Resume.Trials, ResumeTrial{Cold: ms(300), Hot: ms(200), Warm: ms(220), Flat: ms(280), Recorded: ms(320)})
	}
	return r
}

// TestPauseTableRows: the table prints correctness, every row with its
// median, range and count, the ratios as ratios, each goal with whether
// the median meets it, the resume's paired ratios, the manifests and the
// load around the run.
func TestPauseTableRows(t *testing.T) {
	var b strings.Builder
	pauseReportForTable().WriteTable(&b)
	out := b.String()
	for _, want := range []string{
		"256 MiB guest, 16 MiB written per cycle, 3 cycles, 2 resume trials, load 1.00 1.00 1.00 → 2.00 2.00 2.00",
		"3/3 cycles correct, chain verify ok",
		"VM paused                               101ms      100ms      102ms    3",
		"pause → child published                 400ms      400ms      400ms    3  ≤ 1000 ms  yes",
		"child bytes / written bytes             1.062      1.000      1.125    3\n",
		// 16 MiB stored over 4000 differing pages (15.625 MiB): 1.024.
		"child bytes / differing bytes           1.088      1.024      1.152    3  ≤ 1.10     yes",
		"resume of the last child (depth 3",
		"  file-cold                             305ms      300ms      310ms    2",
		// Per trial 300/200 = 1.5 and 310/210 = 1.476: the goal fails.
		"  file-cold / hot                       1.488      1.476      1.500    2  ≤ 1.30     no",
		"  depth 3 / flattened, file-cold        1.070      1.069      1.071    2  ≤ 1.10     yes",
		"  harvested / recorded, file-cold       0.938      0.938      0.939    2\n",
		"harvested 512 pages (2.0 MiB, 7 ranges), recorded 256 pages (1.0 MiB, 5 ranges), 256 in common, Jaccard 0.500; 1 restores not admitted",
		"the pause goes mostly to building the layer: median 300 ms of 400 ms (75%)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestPauseTableSaysWhatFailed: a run whose chain was not verified and
// whose cycles were not all correct says so in its first lines, and no
// step is named when none dominates.
func TestPauseTableSaysWhatFailed(t *testing.T) {
	r := pauseReportForTable()
	r.CyclesCorrect, r.ChainVerified = 2, false
	for i := range r.Samples {
		r.Samples[i].Timings.Layer = 150 * time.Millisecond
	}
	var b strings.Builder
	r.WriteTable(&b)
	if out := b.String(); !strings.Contains(out, "2/3 cycles correct, chain not verified") || strings.Contains(out, "goes mostly") {
		t.Errorf("table:\n%s", out)
	}
}

// TestManifestOverlap: the Jaccard index of two manifests' pages.
func TestManifestOverlap(t *testing.T) {
	const p = layers.PageBytes
	a := &manifest.Manifest{Ranges: []manifest.Range{{Offset: 0, Length: 4 * p}}}
	b := &manifest.Manifest{Ranges: []manifest.Range{{Offset: 2 * p, Length: 2 * p}, {Offset: 8 * p, Length: 2 * p}}}
	if common, j := overlap(a, b); common != 2 || j != 2.0/6 {
		t.Errorf("overlap = %d, %v; want 2 pages, 1/3", common, j)
	}
	if common, j := overlap(&manifest.Manifest{}, &manifest.Manifest{}); common != 0 || j != 0 {
		t.Errorf("two empty manifests: %d, %v", common, j)
	}
}

// TestPauseReportJSONFollowsTheConvention: the pause bench's JSON gives
// sizes in bytes and durations in integer nanoseconds (docs/json.md).
func TestPauseReportJSONFollowsTheConvention(t *testing.T) {
	r := pauseReportForTable()
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	apitest.CheckConvention(t, "pause bench report", data)
	var doc struct {
		MemoryBytes int64 `json:"memory_bytes"`
		WriteBytes  int64 `json:"write_bytes"`
		Resume      struct {
			Trials []struct {
				Cold int64 `json:"cold_ns"`
			} `json:"trials"`
		} `json:"resume"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.MemoryBytes != 256<<20 || doc.WriteBytes != 16<<20 || len(doc.Resume.Trials) != 2 || doc.Resume.Trials[0].Cold != int64(300*time.Millisecond) {
		t.Errorf("memory_bytes %d, write_bytes %d, trials %v: %s", doc.MemoryBytes, doc.WriteBytes, doc.Resume.Trials, data)
	}
}
