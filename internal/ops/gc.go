package ops

import (
	"context"
	"fmt"

	"warmstart/internal/repository"
	"warmstart/internal/repository/s3"
)

// CollectGarbage reclaims what deletes and crashed publishes left in an
// S3 repository: the sweep of unfinished publishes, then the chunks no
// snapshot needs. A POSIX store keeps no shared chunks and reclaims
// crashed publishes whenever it is opened, so it has nothing to collect:
// collected is then false.
func CollectGarbage(ctx context.Context, repo repository.Repository) (st s3.GCStats, collected bool, err error) {
	r, ok := repo.(*s3.Repo)
	if !ok {
		return st, false, nil
	}
	if err := r.Sweep(ctx); err != nil {
		return st, true, fmt.Errorf("snapshot gc: %w", err)
	}
	if st, err = r.CollectGarbage(ctx); err != nil {
		return st, true, fmt.Errorf("snapshot gc: %w", err)
	}
	return st, true, nil
}
