package daemon

import (
	"context"
	"testing"
)

// SetRestoreReadyHook has hook run with the request's context once a
// restore is ready, before the daemon takes it in, until t ends.
func SetRestoreReadyHook(t testing.TB, hook func(context.Context)) {
	testHookRestoreReady = hook
	t.Cleanup(func() { testHookRestoreReady = nil })
}
