package ops_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"warmstart/internal/node"
	"warmstart/internal/ops"
	"warmstart/internal/repository/repotest"
	"warmstart/internal/restore"
)

// A restore asked to prefetch (on) a snapshot without a startup manifest
// is refused before anything starts, in the asker's words: the CLI's
// message names its flag, the daemon's the request field, never the other.
func TestPrefetchOnWithoutAManifestNamesTheFieldAsAsked(t *testing.T) {
	ctx := context.Background()
	n := &node.Node{Repo: openStore(t)}
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	if _, _, err := ops.Publish(ctx, n.Repo, in.Request("bare")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		names         ops.Names
		want, notWant string
	}{
		{ops.Flags, `--prefetch "on": snapshot bare has no startup manifest`, ` prefetch "`},
		{ops.JSONFields, `prefetch "on": snapshot bare has no startup manifest`, "--prefetch"},
	} {
		_, _, err := ops.Restore(ctx, n, "bare", restore.Options{Prefetch: restore.ModeOn}, tc.names)
		also := "or restore with " + tc.names["prefetch"] + ` "auto" or "off"`
		if !errors.Is(err, ops.ErrNoManifest) || !strings.HasPrefix(err.Error(), tc.want) || !strings.Contains(err.Error(), also) ||
			strings.Contains(err.Error(), tc.notWant) {
			t.Errorf("restore with prefetch on, names %v: %v; want ErrNoManifest starting %q, without %q", tc.names["prefetch"], err, tc.want, tc.notWant)
		}
	}
}
