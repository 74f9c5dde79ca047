package recorder_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/logtest"
)

// TestCancelledRecordingIsNotLoggedAsAFailure: a background recording
// cancelled by its owner (the daemon or the CLI shutting down on SIGTERM)
// is logged at INFO as stopped, not at ERROR as a failure; the daemon
// resumes it at its next start.
func TestCancelledRecordingIsNotLoggedAsAFailure(t *testing.T) {
	e := newEnv(t)
	_, lease := e.publish(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The VMM starts only once the recording is cancelled, so that it
	// cannot finish first.
	started := make(chan struct{})
	e.vm.setBeforeStart(func() {
		close(started)
		<-ctx.Done()
	})
	defer e.vm.setBeforeStart(nil)
	var logs logtest.Buffer
	rec := e.recorder(config.DeviceFile)
	rec.Log = slog.New(slog.NewTextHandler(&logs, nil))
	job := rec.Start(ctx, lease)
	waitFor(t, started, "the recording's VMM to start")
	cancel()
	if _, err := jobResult(t, job); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled recording ended with %v, want context.Canceled", err)
	}
	out := logs.String()
	if strings.Contains(out, "level=ERROR") || !strings.Contains(out, "startup manifest recording stopped") {
		t.Fatalf("log of a cancelled recording:\n%s\nwant an INFO line saying it stopped, no ERROR", out)
	}
}
