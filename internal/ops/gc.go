package ops

import (
	"context"
	"errors"
	"fmt"

	"warmstart/internal/repository"
	"warmstart/internal/repository/s3"
)

// CollectGarbage reclaims what deletes and crashed publishes left in an
// S3 repository: the sweep of unfinished publishes, then the chunks no
// snapshot needs. A POSIX store keeps no shared chunks and reclaims
// crashed publishes whenever it is opened, so it has nothing to collect:
// collected is then false. A snapshot the sweep or the collection could
// not read or clean up does not stop either: st.Failed names every such
// snapshot, of both, and err is then an s3.IncompleteError naming them.
func CollectGarbage(ctx context.Context, repo repository.Repository) (st s3.GCStats, collected bool, err error) {
	r, ok := repo.(*s3.Repo)
	if !ok {
		return st, false, nil
	}
	var swept, gone *s3.IncompleteError
	if err := r.Sweep(ctx); err != nil && !errors.As(err, &swept) {
		return st, true, fmt.Errorf("snapshot gc: %w", err)
	}
	st, err = r.CollectGarbage(ctx)
	if swept != nil {
		st.Failed = append(swept.Failed, st.Failed...)
	}
	if err != nil && !errors.As(err, &gone) {
		return st, true, fmt.Errorf("snapshot gc: %w", err)
	}
	if len(st.Failed) > 0 {
		return st, true, fmt.Errorf("snapshot gc: %w", &s3.IncompleteError{Failed: st.Failed})
	}
	return st, true, nil
}
