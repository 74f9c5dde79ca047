package snapcheck

import (
	"context"

	"warmstart/internal/repository"
)

// StartupPackArtifact names the startup pack in a report: an S3 snapshot's
// startup set packed in first-touch order (package s3).
const StartupPackArtifact = "startup pack"

// packVerifier is a repository that keeps a startup pack beside the
// manifest and can read it whole, checking every frame (s3.Repo).
type packVerifier interface {
	VerifyStartupPack(ctx context.Context, rec repository.Record, manifestPath string) error
}

// startupPack reads the snapshot's startup packs (the recorded manifest's
// and the refined one's) whole, when the record names any: a damaged pack
// never reaches a guest (restores fall back to the chunks), so only verify
// can tell.
func (c *checker) startupPack() {
	rec := c.res.Record
	if rec.StartupPack == nil && rec.RefinedPack == nil {
		return
	}
	a := c.r.artifact(StartupPackArtifact)
	pv, ok := findIn[packVerifier](c.repo)
	if !ok {
		a.Note = "this repository cannot read its startup pack here"
		return
	}
	a.Status = StatusOK
	if err := pv.VerifyStartupPack(c.ctx, rec, c.res.ManifestPath); err != nil {
		a.problem(KindRead, "%v", err)
		return
	}
	for _, p := range []*repository.StartupPackDescriptor{rec.StartupPack, rec.RefinedPack} {
		if p != nil {
			a.ReadBytes += p.StoredBytes
		}
	}
}
