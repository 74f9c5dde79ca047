package s3bench

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"warmstart/internal/api/apitest"
)

// floorReport is a run at 20 ms and 1 Gbit/s with a 36.875 MB startup
// pack: 295 ms on the link, so a floor of 315 ms. Cold with prefetch is
// ready in 315, 315 and 945 ms (mean 525 ms = 1.6667x, median 315 ms =
// 1.00x); cold without prefetch in 630 ms (2.00x) once.
func floorReport() *Report {
	coldOn, coldOff := Conditions[1], Conditions[0]
	warmOn := Conditions[3]
	r := &Report{
		Options: Options{LatencyMs: 20, LinkBits: 1_000_000_000, Conditions: []Condition{coldOff, coldOn, warmOn}},
		Storage: Storage{StartupSetStoredBytes: 36_875_000},
		Trials: []Trial{
			{Block: 0, Condition: coldOn, ReadyMs: 315}, {Block: 1, Condition: coldOn, ReadyMs: 945},
			{Block: 2, Condition: coldOn, ReadyMs: 315}, {Block: 0, Condition: coldOff, ReadyMs: 630},
			{Block: 0, Condition: warmOn, ReadyMs: 100},
		},
	}
	r.summarize()
	return r
}

func TestColdNodeOverTheLinksFloor(t *testing.T) {
	r := floorReport()
	if math.Abs(r.LinkFloorMs-315) > 1e-9 {
		t.Fatalf("floor %v ms, want 315 (20 ms + 36.875 MB at 1 Gbit/s)", r.LinkFloorMs)
	}
	want := map[string]*FloorRatio{
		"cold-cache/prefetch-off": {Mean: 2, Median: 2},
		"cold-cache/prefetch-on":  {Mean: 525.0 / 315, Median: 1},
		"warm-cache/prefetch-on":  nil,
	}
	for _, s := range r.Summary {
		got, w := s.OverLinkFloor, want[s.Condition.String()]
		if (got == nil) != (w == nil) || got != nil && (math.Abs(got.Mean-w.Mean) > 1e-9 || math.Abs(got.Median-w.Median) > 1e-9) {
			t.Errorf("%s over the floor %+v, want %+v", s.Condition, got, w)
		}
	}
	var out strings.Builder
	r.WriteTable(&out)
	for _, line := range []string{
		"link's floor: 20 ms latency + 35.2 MiB startup pack at 1000 Mbit/s = 315.0 ms",
		"cold-cache/prefetch-on over the link's floor: mean 1.67x (525.0 ms), median 1.00x (315.0 ms)",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, out.String())
		}
	}
}

func TestLinkFloorJSON(t *testing.T) {
	data := floorReport().JSON()
	apitest.CheckConvention(t, "s3 bench report", data)
	var doc struct {
		LinkFloor *int64 `json:"link_floor_ns"`
		Summary   []struct {
			Over map[string]float64 `json:"ratio_to_link_floor"`
		} `json:"summary"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.LinkFloor == nil || *doc.LinkFloor != 315_000_000 {
		t.Errorf("link_floor_ns %v, want 315000000", doc.LinkFloor)
	}
	if len(doc.Summary) != 3 || doc.Summary[1].Over["median"] != 1 || math.Abs(doc.Summary[1].Over["mean"]-525.0/315) > 1e-9 ||
		doc.Summary[2].Over != nil {
		t.Errorf("summaries %+v: want cold-on mean 1.667, median 1 and no warm ratio", doc.Summary)
	}
}

func TestNoFloorWithoutAStartupPack(t *testing.T) {
	r := &Report{Options: Options{LatencyMs: 20, LinkBits: 1_000_000_000, Conditions: Conditions[:2]},
		Trials: []Trial{{Condition: Conditions[1], ReadyMs: 300}}}
	r.summarize()
	if r.LinkFloorMs != 0 || r.Summary[1].OverLinkFloor != nil {
		t.Errorf("floor %v, ratio %+v without a startup pack; want none", r.LinkFloorMs, r.Summary[1].OverLinkFloor)
	}
	if strings.Contains(string(r.JSON()), "link_floor_ns") {
		t.Errorf("link_floor_ns written without a floor")
	}
}
