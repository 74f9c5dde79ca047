package report

import (
	"bytes"
	"strings"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/restore"
)

// A then=stop pause whose stop failed says so, not "stopped".
func TestPausedWhoseStopFailedSaysSo(t *testing.T) {
	var b bytes.Buffer
	Paused(&b, api.PauseResult{Snapshot: "kid", Parent: "base", Depth: 1,
		Stop: &restore.StopReport{}, StopError: "release the device: busy"})
	out := b.String()
	if !strings.Contains(out, "stop failed after the child was published: release the device: busy") {
		t.Errorf("report %q does not say the stop failed", out)
	}
	if strings.Contains(out, "stopped") {
		t.Errorf("report %q says the restore stopped", out)
	}
}
