package apitest

import (
	"strings"
	"testing"
)

func TestConventionFindsEachBreak(t *testing.T) {
	for _, c := range []struct {
		doc, want string
	}{
		{`{"ready": {"pid": "29253"}}`, `$.ready.pid = "29253": a number written as a string`},
		{`{"ok": "true"}`, `a boolean written as a string`},
		{`{"ready_ms": 1.5}`, `unit _ms`},
		{`{"ended_before_ready_seconds": 0.2}`, `unit _seconds`},
		{`{"manifest_mib": 3}`, `unit _mib`},
		{`{"ready_ns": 1.5}`, `a duration is an integer of nanoseconds`},
		{`{"ready_ns": "15"}`, `a duration is an integer of nanoseconds`},
		{`{"readyNs": 15}`, `key is not snake_case`},
		{`{"state": "running", "stop": {"release_ack_ns": 1}}`, `want stopped`},
		{`[{"trials": [{"x": {"GetsToReady": 1}}]}]`, `$[0].trials[0].x.GetsToReady: key is not snake_case`},
	} {
		got := Convention([]byte(c.doc))
		if len(got) != 1 || !strings.Contains(got[0], c.want) {
			t.Errorf("%s: %q, want one break saying %q", c.doc, got, c.want)
		}
	}
	ok := `{"id": "r1", "state": "stopped", "stop": {"release_ack_ns": 12}, "ready": {"pid": 7, "sha256": "ab"},
		"faster_every_pair": {"warmstart+learned": true}, "mean_gets": 40.5, "started_at": "2026-12-07T04:00:00Z"}`
	if got := Convention([]byte(ok)); len(got) != 0 {
		t.Errorf("a document that keeps the convention: %q", got)
	}
}
