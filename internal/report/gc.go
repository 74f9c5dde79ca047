package report

import (
	"errors"
	"fmt"
	"io"

	"warmstart/internal/repository/s3"
)

// Collected prints what `snapshot gc` did and returns the error the verb
// ends with. err is ops.CollectGarbage's: a collection that stopped
// prints nothing and fails with it; one that went on past failures on
// some snapshots (s3.IncompleteError) prints st and each failure, and
// fails saying how many. Without a collection (collected false) it says a
// POSIX store has nothing to collect.
func Collected(w io.Writer, st s3.GCStats, collected bool, err error) error {
	var inc *s3.IncompleteError
	if err != nil && !errors.As(err, &inc) {
		return err
	}
	if !collected {
		_, err := fmt.Fprintln(w, "nothing to collect: a POSIX store keeps no shared chunks")
		return err
	}
	if _, err := fmt.Fprintf(w, "%d chunks: %d in use, %d unused but within their grace, %d kept for publishes in progress, %d removed (%d bytes; %d of them left by publishes that never finished); %d tombstones removed; %d layers retired by flattens and %d markers of children never published removed\n",
		st.Chunks, st.Live, st.Young, st.Publishing, st.Removed, st.RemovedBytes, st.Abandoned, st.Tombstones, st.RetiredLayers, st.Markers); err != nil {
		return err
	}
	for _, f := range st.Failed {
		if _, err := fmt.Fprintf(w, "not collected, kept: %v\n", f); err != nil {
			return err
		}
	}
	if inc != nil {
		return fmt.Errorf("snapshot gc: %s not collected (listed above), what could not be read kept; run it again once they can be read", inc.Count())
	}
	return nil
}
