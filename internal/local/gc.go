package local

import (
	"context"
	"fmt"

	"warmstart/internal/report"
	"warmstart/internal/repository"
	"warmstart/internal/repository/s3"
)

// CollectGarbage reclaims what deletes and crashed publishes left in an S3
// repository: the sweep of unfinished publishes, then the chunks no
// snapshot needs. A POSIX store keeps no shared chunks and reclaims
// crashed publishes whenever it is opened, so it has nothing to collect.
func CollectGarbage(ctx context.Context, repo repository.Repository, o report.Output) error {
	r, ok := repo.(*s3.Repo)
	if !ok {
		_, err := fmt.Fprintln(o.Out, "nothing to collect: a POSIX store keeps no shared chunks")
		return err
	}
	if err := r.Sweep(ctx); err != nil {
		return fmt.Errorf("snapshot gc: %w", err)
	}
	st, err := r.CollectGarbage(ctx)
	if err != nil {
		return fmt.Errorf("snapshot gc: %w", err)
	}
	_, err = fmt.Fprintf(o.Out, "%d chunks: %d in use, %d unused but within their grace, %d kept for publishes in progress, %d removed (%d bytes; %d of them left by publishes that never finished); %d tombstones removed\n",
		st.Chunks, st.Live, st.Young, st.Publishing, st.Removed, st.RemovedBytes, st.Abandoned, st.Tombstones)
	return err
}
