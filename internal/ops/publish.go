package ops

import (
	"context"
	"fmt"

	"warmstart/internal/layout"
	"warmstart/internal/repository"
)

// Publish publishes a snapshot into repo under a capture lease of its own.
// With req.RecordManifest (the record says a recording was asked for, so
// that a daemon resumes it should the recorder die) the lease is returned
// still held, for the caller to hand to a recorder (node.Recorder.Start),
// so that no one deletes the snapshot before its manifest is attached;
// otherwise it is ended and the lease returned is nil. On failure nothing
// is held.
func Publish(ctx context.Context, repo repository.Repository, req repository.PublishRequest) (repository.Record, repository.Lease, error) {
	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		return repository.Record{}, nil, err
	}
	rec, err := repo.Publish(ctx, lease, req)
	if err != nil {
		lease.End()
		return repository.Record{}, nil, err
	}
	if req.RecordManifest {
		return rec, lease, nil
	}
	if err := lease.End(); err != nil {
		return rec, nil, fmt.Errorf("%s: end capture lease: %w", rec.ID, err)
	}
	return rec, nil, nil
}

// ImportLayout is the memory layout an import's layout field (spec, the
// flag or JSON field that n names "layout") gives a memory file of
// memBytes at memPath: one region over the whole file when spec is empty.
// A spec that does not fit is a *FieldError of field "layout"; a memory
// file no layout can cover (spec empty) one of field "memory".
func ImportLayout(spec, memPath string, memBytes int64, n Names) (layout.Layout, error) {
	lay, err := layout.Parse(spec, memBytes)
	switch {
	case err == nil:
		return lay, nil
	case spec == "":
		return lay, n.fieldError("memory", fmt.Errorf("memory file %s (%d bytes): %w", memPath, memBytes, err))
	}
	return lay, n.fieldError("layout", fmt.Errorf("%s %q for memory file %s (%d bytes): %w", n.name("layout"), spec, memPath, memBytes, err))
}
