package report

import (
	"fmt"
	"io"

	"warmstart/internal/repository/s3"
)

// Collected prints what `snapshot gc` did: st when it collected, else that
// a POSIX store has nothing to collect.
func Collected(w io.Writer, st s3.GCStats, collected bool) error {
	if !collected {
		_, err := fmt.Fprintln(w, "nothing to collect: a POSIX store keeps no shared chunks")
		return err
	}
	_, err := fmt.Fprintf(w, "%d chunks: %d in use, %d unused but within their grace, %d kept for publishes in progress, %d removed (%d bytes; %d of them left by publishes that never finished); %d tombstones removed; %d layers retired by flattens and %d markers of children never published removed\n",
		st.Chunks, st.Live, st.Young, st.Publishing, st.Removed, st.RemovedBytes, st.Abandoned, st.Tombstones, st.RetiredLayers, st.Markers)
	return err
}
