package restore

import (
	"errors"
	"fmt"

	"warmstart/internal/manifest"
	"warmstart/internal/repository"
)

// Which manifest a restore prefetched (PrefetchReport.Manifest).
const (
	ManifestRecorded = "recorded"
	ManifestRefined  = "refined"
)

// refinedManifest returns the snapshot's learned manifest, validated
// exactly like the recorded one (digest and size against the record,
// format, layout), and its digest, the prefetch key: restores of one
// refinement share their prefetch, and a refinement that changed pages or
// order is a new key. nil when refine is off or the snapshot has none; a
// refinement that fails a check is reported in rep.Fallback (and counted
// as a rejected manifest), and the recorded manifest is used instead.
func (r *Restorer) refinedManifest(src Source, rep *PrefetchReport) (*manifest.Manifest, string) {
	d := src.Refinement
	if !r.Refine || d == nil {
		return nil, ""
	}
	data, err := repository.ReadRefinedManifest(src.RefinementPath, *d)
	if err == nil {
		var m *manifest.Manifest
		m, err = manifest.Verify(data, manifest.Descriptor{SHA256: d.ManifestSHA256, Size: d.ManifestSize}, src.Layout)
		if err == nil {
			rep.Manifest = ManifestRefined
			return m, d.ManifestSHA256
		}
	}
	reason := reasonOf(err)
	if errors.Is(err, repository.ErrRefinementCorrupt) {
		reason = "corrupt"
	}
	if r.Observe != nil {
		r.Observe.ManifestRejected(reason)
	}
	rep.Fallback = fmt.Sprintf("refined manifest rejected (%s): %v; using the recorded manifest", reason, err)
	if r.Log != nil {
		r.Log.Warn("refined manifest rejected; prefetching the recorded manifest", "snapshot", src.SnapshotID, "reason", err)
	}
	return nil, ""
}
