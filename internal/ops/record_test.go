package ops

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"warmstart/internal/recorder"
)

// TestUnrecordedManifestSaysWhy: a recording discarded because the
// snapshot was deleted meanwhile says so, rather than only that the
// manifest was not recorded; any other failure keeps its cause.
func TestUnrecordedManifestSaysWhy(t *testing.T) {
	discarded := fmt.Errorf("record manifest X: %w: snapshot X: not found", recorder.ErrDiscarded)
	err := NotRecorded("X", discarded)
	if !errors.Is(err, recorder.ErrDiscarded) || !strings.Contains(err.Error(), "deleted") {
		t.Errorf("discarded recording: %v", err)
	}
	other := errors.New("replay vmm not ready in time")
	if err := NotRecorded("X", other); !errors.Is(err, other) || strings.Contains(err.Error(), "deleted") {
		t.Errorf("failed recording: %v", err)
	}
}
