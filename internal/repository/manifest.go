package repository

import (
	"context"
	"fmt"

	"warmstart/internal/manifest"
)

// ReadManifest reads the startup manifest attached to the snapshot with id
// or alias ref, verified against its record, and returns its path, its
// bytes and the decoded manifest.
func ReadManifest(ctx context.Context, repo Repository, ref string) (string, []byte, *manifest.Manifest, error) {
	rec, err := repo.Lookup(ctx, ref)
	if err != nil {
		return "", nil, nil, fmt.Errorf("manifest of %s: no such file, and %w", ref, err)
	}
	if rec.Manifest == nil {
		return "", nil, nil, fmt.Errorf("snapshot %s has no startup manifest", ref)
	}
	res, err := repo.Resolve(ctx, rec.ID)
	if err != nil {
		return "", nil, nil, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	data, err := manifest.ReadFile(res.ManifestPath)
	if err != nil {
		return "", nil, nil, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	m, err := manifest.Verify(data, manifest.Descriptor{SHA256: rec.Manifest.SHA256, Size: rec.Manifest.Size}, rec.Layout)
	if err != nil {
		return "", nil, nil, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	return res.ManifestPath, data, m, nil
}
