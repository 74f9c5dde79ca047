package local

import (
	"context"

	"warmstart/internal/chart"
	"warmstart/internal/ops"
	"warmstart/internal/report"
	"warmstart/internal/repository"
)

// InspectRequest is what `manifest inspect` shows.
type InspectRequest struct {
	// Ref is a manifest file or, when no such file exists, a snapshot id
	// or alias.
	Ref           string
	JSON, Verbose bool
	// Plot, when set, is where the memory map is drawn.
	Plot string
}

// InspectManifest prints the manifest req.Ref names, and draws its map when
// asked. openRepo opens the repository read-only, only for a snapshot ref.
func InspectManifest(ctx context.Context, o report.Output, req InspectRequest, openRepo func() (repository.Repository, error)) error {
	path, data, m, err := ops.InspectManifest(ctx, req.Ref, openRepo)
	if err != nil {
		return err
	}
	if req.Plot != "" {
		if err := chart.Manifest(req.Plot, m); err != nil {
			return err
		}
	}
	if req.JSON {
		return report.ManifestJSON(o.Out, path, data, m)
	}
	return report.ManifestText(o.Out, path, data, m, req.Verbose)
}
