package local

import (
	"context"
	"fmt"

	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/repository"
)

// CollectGarbage reclaims what deletes and crashed publishes left in an S3
// repository: the sweep of unfinished publishes, then the chunks no
// snapshot needs. A POSIX store keeps no shared chunks and reclaims
// crashed publishes whenever it is opened, so it has nothing to collect.
func CollectGarbage(ctx context.Context, repo repository.Repository, o report.Output) error {
	st, collected, err := ops.CollectGarbage(ctx, repo)
	if err != nil {
		return err
	}
	if !collected {
		_, err := fmt.Fprintln(o.Out, "nothing to collect: a POSIX store keeps no shared chunks")
		return err
	}
	_, err = fmt.Fprintf(o.Out, "%d chunks: %d in use, %d unused but within their grace, %d removed (%d bytes); %d tombstones removed\n",
		st.Chunks, st.Live, st.Young, st.Removed, st.RemovedBytes, st.Tombstones)
	return err
}
