package recorder_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"warmstart/internal/logtest"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/restore/restoretest"
)

// TestDeletionAfterResolveIsDiscardedNotCorrupt deletes the snapshot
// between the recording's resolve and its restore's first look at the
// artifacts (the hook runs inside Resolve's return, so the restore finds
// the VM state file gone). That is a deletion racing the recording: the
// recording ends as discarded, and neither its error, the integrity
// counter nor the log speaks of an integrity failure: no byte was checked
// and found wrong.
func TestDeletionAfterResolveIsDiscardedNotCorrupt(t *testing.T) {
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			e := newEnv(t)
			counter := &restoretest.IntegrityCounter{}
			logs := &logtest.Buffer{}
			e.restorer.Observe = counter
			e.restorer.Log = slog.New(slog.NewTextHandler(logs, nil))
			ctx := context.Background()
			id, lease := e.publish(t)
			e.hooked.setHooks(func(string) {
				if err := e.repo.Delete(ctx, id); err != nil {
					t.Error(err)
				}
			}, nil)
			defer e.hooked.setHooks(nil, nil)
			rec := e.recorder(device)
			rec.Log = e.restorer.Log
			_, err := jobResult(t, rec.Start(ctx, lease))
			if !errors.Is(err, recorder.ErrDiscarded) {
				t.Fatalf("recording of a snapshot deleted after resolve: %v, want ErrDiscarded", err)
			}
			if errors.Is(err, repository.ErrIntegrity) {
				t.Errorf("a discarded recording's error matches ErrIntegrity: %v", err)
			}
			if got := counter.Failures(); len(got) != 0 {
				t.Errorf("integrity failures counted: %v; want none", got)
			}
			out := logs.String()
			if strings.Contains(out, "integrity") || !strings.Contains(out, "startup manifest recording discarded") {
				t.Errorf("log speaks of integrity or not of a discarded recording:\n%s", out)
			}
			e.checkGone(t, id)
		})
	}
}
