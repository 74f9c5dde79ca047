package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"warmstart/internal/api"
)

// TestPauseThenStopWhoseStopFails: with then=stop the child is published
// and then the stop fails (a mount in the restore's directory keeps the
// stop from removing it, after the VM stopped). The answer is the child,
// with stop_error saying why the stop failed, not an error: a client that
// took the pause for failed would pause again. The child restores whole.
func TestPauseThenStopWhoseStopFails(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	f := newFixture(t, fixtureOptions{})
	r, imp, in := pausableRestore(t, f, nil)
	runDir := filepath.Join(f.cfg.Runtime.Dir, "daemon", "restores", in.ID)
	if _, err := os.Stat(runDir); err != nil {
		t.Fatalf("the restore's directory: %v", err)
	}
	mountOrSkip(t, "tmpfs", filepath.Join(runDir, "busy"), "tmpfs", 0, "size=1m")
	ctx := context.Background()
	res, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenStop})
	if err != nil {
		t.Fatalf("a pause whose child was published answered an error: %v", err)
	}
	if res.Parent != imp.ID || res.Snapshot == "" || !strings.Contains(res.StopError, "busy") || res.Stop == nil {
		t.Fatalf("pause: %+v; want the child of %s, its stop and stop_error naming what failed", res, imp.ID)
	}
	if info, err := r.client.Restores(ctx); err != nil || len(info) != 0 {
		t.Fatalf("restores after the stop: %+v, %v; want none", info, err)
	}
	childReadsStamped(t, r, f, "kid")
	verifyOK(t, r.client, imp.ID, "kid")
}
