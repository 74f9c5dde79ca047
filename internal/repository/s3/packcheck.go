package s3

import (
	"context"
	"fmt"
	"io"

	"warmstart/internal/repository"
)

// VerifyStartupPack reads the startup pack rec names whole, as a restore
// streams it: its index fetched and checked against the record, every
// frame decoded and checked against the index's digest. A restore that
// finds the pack unusable falls back to the chunks and reports only what
// it read of it (StartupPackSkipped); snapshot verify asks here for the
// whole pack. manifestPath is the local manifest the pack was built from
// (Resolved.ManifestPath). A record without a pack has nothing to check.
func (r *Repo) VerifyStartupPack(ctx context.Context, rec repository.Record, manifestPath string) error {
	if rec.StartupPack == nil {
		return nil
	}
	ps, err := r.loadPack(ctx, rec, manifestPath)
	if err != nil {
		return fmt.Errorf("startup pack of %s: %w", rec.ID, err)
	}
	body, err := ps.obj.Fetch(ctx, 0, ps.obj.Size)
	if err != nil {
		return fmt.Errorf("startup pack of %s: %w", rec.ID, err)
	}
	defer body.Close()
	n, err := io.Copy(io.Discard, body)
	if err != nil {
		return fmt.Errorf("startup pack of %s: after %d of %d bytes: %w", rec.ID, n, ps.obj.Size, err)
	}
	if n != ps.obj.Size {
		return fmt.Errorf("startup pack of %s: %d of %d bytes", rec.ID, n, ps.obj.Size)
	}
	return nil
}
