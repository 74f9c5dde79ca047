package s3

import (
	"context"
	"fmt"
	"io"

	"warmstart/internal/repository"
)

// VerifyStartupPack reads the startup packs rec names whole, as a restore
// streams them: the recorded manifest's and the refined one's, each index
// fetched and checked against the record, every frame decoded and checked
// against the index's digest. A restore that finds a pack unusable falls
// back (to the recorded pack, to the chunks) and reports only what it read
// of it (StartupPackSkipped); snapshot verify asks here for the whole
// packs. manifestPath is the local recorded manifest (Resolved.ManifestPath),
// which a format-1 index is read with; a refined pack's index names its own
// ranges. A record without a pack has nothing to check.
func (r *Repo) VerifyStartupPack(ctx context.Context, rec repository.Record, manifestPath string) error {
	if rec.StartupPack != nil {
		ps, err := r.loadPack(ctx, rec, manifestPath)
		if err != nil {
			return fmt.Errorf("startup pack of %s: %w", rec.ID, err)
		}
		if err := readWholePack(ctx, ps); err != nil {
			return fmt.Errorf("startup pack of %s: %w", rec.ID, err)
		}
	}
	if rec.RefinedPack != nil {
		ps, err := r.loadRefinedPack(ctx, rec)
		if err != nil {
			return fmt.Errorf("refined startup pack of %s: %w", rec.ID, err)
		}
		if err := readWholePack(ctx, ps); err != nil {
			return fmt.Errorf("refined startup pack of %s: %w", rec.ID, err)
		}
	}
	return nil
}

// readWholePack fetches ps front to back, every frame checked.
func readWholePack(ctx context.Context, ps *packSource) error {
	body, err := ps.obj.Fetch(ctx, 0, ps.obj.Size)
	if err != nil {
		return err
	}
	defer body.Close()
	n, err := io.Copy(io.Discard, body)
	if err != nil {
		return fmt.Errorf("after %d of %d bytes: %w", n, ps.obj.Size, err)
	}
	if n != ps.obj.Size {
		return fmt.Errorf("%d of %d bytes", n, ps.obj.Size)
	}
	return nil
}
