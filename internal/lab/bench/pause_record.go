package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"warmstart/internal/layers"
	"warmstart/internal/manifest"
	"warmstart/internal/ops"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/restore"
)

// flattenedCopy copies the store and flattens id in the copy (its diff
// layers merged into one over its base), so the chain in the run's store
// stays as it is; it returns the flattened snapshot resolved.
func flattenedCopy(ctx context.Context, storeRoot, workDir, id string) (repository.Resolved, error) {
	root := filepath.Join(workDir, "flattened-store")
	// A copy, never links: the copy's files own their page cache, which
	// the cold trials drop.
	if err := os.CopyFS(root, os.DirFS(storeRoot)); err != nil {
		return repository.Resolved{}, fmt.Errorf("copy the store to flatten %s: %w", id, err)
	}
	flat, err := posixfs.Open(root, posixfs.Options{})
	if err != nil {
		return repository.Resolved{}, err
	}
	if _, err := ops.Flatten(ctx, flat, id, ops.FlattenOptions{StagingDir: flat.Root(), Link: true}); err != nil {
		return repository.Resolved{}, err
	}
	return flat.Resolve(ctx, id)
}

// recordedSource records the child's startup manifest as a throwaway
// resume does (one traced restore to ready on the recorder's own mount,
// first touches in order) and returns the chain's source prefetching it
// instead of the harvested one; neither snapshot nor record changes. It
// fills in both manifests' sizes and overlap.
func (p *pauseRun) recordedSource(ctx context.Context, chain resumeSource, rep *ResumeReport) (resumeSource, error) {
	src := chain.src
	harvested, err := readManifest(src)
	if err != nil {
		return resumeSource{}, fmt.Errorf("harvested manifest: %w", err)
	}
	inst, err := p.n.Recorder.Restorer.Restore(ctx, src, restore.Options{Prefetch: restore.ModeOff, Trace: true, DeviceKey: "record-throwaway"})
	if err != nil {
		return resumeSource{}, fmt.Errorf("throwaway resume: %w", err)
	}
	offsets := make([]int64, len(inst.Trace))
	for i, t := range inst.Trace {
		offsets[i] = t.Offset
	}
	if err := inst.Stop(context.WithoutCancel(ctx)); err != nil {
		return resumeSource{}, fmt.Errorf("throwaway resume: %w", err)
	}
	recorded, err := manifest.Build(src.Layout, offsets)
	if err != nil {
		return resumeSource{}, fmt.Errorf("recorded manifest: %w", err)
	}
	data, err := manifest.Encode(recorded)
	if err != nil {
		return resumeSource{}, fmt.Errorf("recorded manifest: %w", err)
	}
	path := filepath.Join(p.o.WorkDir, "recorded-manifest.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return resumeSource{}, fmt.Errorf("recorded manifest: %w", err)
	}
	d := manifest.Describe(data)
	src.ManifestPath, src.Manifest, src.Refinement, src.RefinementPath = path, &d, nil, ""
	rep.Harvested, rep.Recorded = factsOf(harvested), factsOf(recorded)
	rep.CommonPages, rep.Jaccard = overlap(harvested, recorded)
	return resumeSource{name: "recorded", src: src, lowers: chain.lowers}, nil
}

// readManifest reads and checks the manifest src prefetches.
func readManifest(src restore.Source) (*manifest.Manifest, error) {
	if src.Manifest == nil {
		return nil, fmt.Errorf("snapshot %s has none", src.SnapshotID)
	}
	data, err := manifest.ReadFile(src.ManifestPath)
	if err != nil {
		return nil, err
	}
	return manifest.Verify(data, *src.Manifest, src.Layout)
}

func factsOf(m *manifest.Manifest) ManifestFacts {
	return ManifestFacts{Pages: m.TotalBytes() / layers.PageBytes, Bytes: m.TotalBytes(), Ranges: len(m.Ranges)}
}

// pagesOf is the set of page offsets a manifest covers.
func pagesOf(m *manifest.Manifest) map[int64]bool {
	set := make(map[int64]bool)
	for _, r := range m.Ranges {
		for off := r.Offset; off < r.End(); off += layers.PageBytes {
			set[off] = true
		}
	}
	return set
}

// overlap is the pages two manifests share and their Jaccard index
// (shared over either's), 0 when both are empty.
func overlap(a, b *manifest.Manifest) (int64, float64) {
	pa, pb := pagesOf(a), pagesOf(b)
	var common int64
	for off := range pa {
		if pb[off] {
			common++
		}
	}
	union := int64(len(pa)+len(pb)) - common
	if union == 0 {
		return 0, 0
	}
	return common, float64(common) / float64(union)
}
