package ops

import (
	"context"

	"warmstart/internal/api"
	"warmstart/internal/repository"
	"warmstart/internal/snapcheck"
	"warmstart/internal/trust"
)

// Show is what `snapshot show` and GET /snapshots/{id} answer: the record
// of the snapshot ref names, what policy (the node's trusted keys) makes
// of it and, when its artifacts check out, where its files are.
func Show(ctx context.Context, repo repository.Repository, policy *trust.Policy, ref string) (api.SnapshotInfo, error) {
	ref, err := ExpandRef(ctx, repo, ref)
	if err != nil {
		return api.SnapshotInfo{}, err
	}
	rec, err := repo.Lookup(ctx, ref)
	if err != nil {
		return api.SnapshotInfo{}, err
	}
	// The record alone is what show promises; file locations are added
	// when the artifacts check out.
	info := api.SnapshotInfo{Record: rec, Trust: policy.Status(rec)}
	if res, err := repo.Resolve(ctx, rec.ID); err != nil {
		info.FilesError = err.Error()
	} else {
		info.Files = &api.SnapshotFiles{VMState: res.VMStatePath, Memory: res.MemoryPath, MemoryLayers: layerFiles(res),
			Manifest: res.ManifestPath}
	}
	return info, nil
}

// layerFiles are the local data files of a layered snapshot's layers, base
// first; nil when it is not layered or a layer is not a local file (S3).
func layerFiles(res repository.Resolved) []string {
	chain, ok := res.Memory.(*repository.ChainSource)
	if !ok {
		return nil
	}
	var files []string
	for _, l := range chain.Layers() {
		if l.DataPath == "" {
			return nil
		}
		files = append(files, l.DataPath)
	}
	return files
}

// List is the catalog f selects: the records, oldest first, then a row
// for each damaged entry, which the second result also lists.
func List(ctx context.Context, repo repository.Repository, f repository.Filter) ([]repository.Entry, []repository.Damage, error) {
	return repository.Listing(ctx, repo, f)
}

// Delete deletes the snapshot ref names (repository.DeleteRef): one that
// does not exist is reported Absent, not an error, after what a crashed
// publish or delete of that id left is reclaimed; an alias naming a
// snapshot that no longer exists is released.
func Delete(ctx context.Context, repo repository.Repository, ref string) (repository.Deletion, error) {
	ref, err := ExpandRef(ctx, repo, ref)
	if err != nil {
		return repository.Deletion{}, err
	}
	return repository.DeleteRef(ctx, repo, ref)
}

// Verify reads every artifact of the snapshot ref names whole and reports
// what does not match its record; problems found are in the report.
func Verify(ctx context.Context, repo repository.Repository, ref string, opts snapcheck.Options) (snapcheck.Report, error) {
	ref, err := ExpandRef(ctx, repo, ref)
	if err != nil {
		return snapcheck.Report{}, err
	}
	return snapcheck.Verify(ctx, repo, ref, opts)
}

// VerifyAll is Verify of every snapshot, damaged catalog entries included.
func VerifyAll(ctx context.Context, repo repository.Repository, opts snapcheck.Options) ([]snapcheck.Report, error) {
	return snapcheck.VerifyAll(ctx, repo, opts)
}
