package daemon

import (
	"context"
	"errors"
	"net/http"
	"testing"
)

// SetRestoreReadyHook has hook run with the request's context once a
// restore is ready, before the daemon takes it in, until t ends. The hook
// is a package variable the daemon reads unsynchronised: set it only in a
// test that does not run in parallel, before its daemon serves.
func SetRestoreReadyHook(t testing.TB, hook func(context.Context)) {
	testHookRestoreReady = hook
	t.Cleanup(func() { testHookRestoreReady = nil })
}

// MsgRefusedPeer is logged when a connection from another user is refused.
const MsgRefusedPeer = msgRefusedPeer

// SetPauseStepHook has hook told of each step of every pause (with the
// pause's context and the restore's id) before the step starts, until t
// ends; as SetRestoreReadyHook, set it before the daemon serves.
func SetPauseStepHook(t testing.TB, hook func(ctx context.Context, id, step string)) {
	testHookPauseStep = hook
	t.Cleanup(func() { testHookPauseStep = nil })
}

// MsgStopWaitsForPause is logged when a stop waits for a pause of its
// restore to end.
const MsgStopWaitsForPause = msgStopWaitsForPause

// PauseFailedStatus is the HTTP status a pause failing with err (its
// context ended with cause) is answered with; 500 when the error is ours.
func PauseFailedStatus(err, cause error) int {
	var ae *apiError
	if errors.As(pauseFailed(err, cause), &ae) {
		return ae.status
	}
	return http.StatusInternalServerError
}
