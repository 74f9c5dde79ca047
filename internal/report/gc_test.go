package report

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"warmstart/internal/repository/s3"
)

// TestCollectedReportsEverySnapshotNotCollected: a collection that went
// on past failures on some snapshots prints what it did and one line per
// failure, and the verb fails saying how many snapshots; one that
// stopped prints nothing and fails with its error.
func TestCollectedReportsEverySnapshotNotCollected(t *testing.T) {
	denied := errors.New("Access Denied.")
	failed := []s3.SnapshotError{{ID: "a", Step: "sweep", Err: denied}, {ID: "a", Step: "retire", Err: denied},
		{ID: "b", Step: "retire", Err: denied}}
	st := s3.GCStats{Chunks: 10, Live: 9, Removed: 1, RetiredLayers: 1, Failed: failed}
	var out bytes.Buffer
	err := Collected(&out, st, true, fmt.Errorf("snapshot gc: %w", &s3.IncompleteError{Failed: failed}))
	if err == nil || !strings.Contains(err.Error(), "2 snapshots not collected") {
		t.Errorf("the verb ends with %v, want it to fail naming 2 snapshots", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "10 chunks: 9 in use") {
		t.Fatalf("printed %q, want the stats and a line per failure", out.String())
	}
	for i, f := range failed {
		if want := "not collected, kept: " + f.ID + ": " + f.Step + ": Access Denied."; lines[i+1] != want {
			t.Errorf("line %d = %q, want %q", i+1, lines[i+1], want)
		}
	}

	out.Reset()
	stopped := errors.New("snapshot gc: list chunks: connection refused")
	if err := Collected(&out, s3.GCStats{}, true, stopped); err != stopped || out.Len() != 0 {
		t.Errorf("a collection that stopped printed %q and ends with %v, want nothing and %v", out.String(), err, stopped)
	}
	if err := Collected(&out, st, true, nil); err != nil {
		t.Errorf("a collection without failures ends with %v", err)
	}
}
