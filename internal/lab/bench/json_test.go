package bench

import (
	"encoding/json"
	"regexp"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/memdev"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
	"warmstart/internal/vmm/qemu"
)

// TestReportJSONIsSnakeCase: every key of bench --json (the report, its
// trials, their specs and sources) is snake case, as in every other JSON
// warmstart writes.
func TestReportJSONIsSnakeCase(t *testing.T) {
	trial := TrialResult{Spec: TrialSpec{
		Condition: Condition{CacheCold, "warmstart"},
		Source: restore.Source{SnapshotID: "s", VMStatePath: "v",
			Layout: layout.Layout{Regions: []layout.Region{{Size: 4096}}}},
		MemoryPath: "m",
		QEMU:       qemu.Options{Binary: "qemu"},
	}, Events: []startupset.Event{{Kind: memdev.Demand, Offset: 4096, Length: 4096}}}
	rep := Report{Options: ReportOptions{Drift: 0.2}, Trials: []TrialResult{trial}, Pilot: &trial,
		Summary: summarize(Options{Blocks: 1}, []TrialResult{trial})}
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	snake := regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if !snake.MatchString(k) && path != ".summary.faster_every_pair" {
					t.Errorf("key %s.%s is not snake case", path, k)
				}
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e)
			}
		}
	}
	walk("", doc)
}
