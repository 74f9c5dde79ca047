package node

import (
	"context"

	"warmstart/internal/recorder"
	"warmstart/internal/repository"
)

// Import publishes a snapshot into repo under a capture lease of its own,
// ended once the snapshot is published.
func Import(ctx context.Context, repo repository.Repository, req repository.PublishRequest) (repository.Record, error) {
	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		return repository.Record{}, err
	}
	defer lease.End()
	rec, err := repo.Publish(ctx, lease, req)
	if err != nil {
		return repository.Record{}, err
	}
	return rec, lease.End()
}

// ImportAndRecord publishes a snapshot into the node's repository and
// starts recording its startup manifest, holding the capture lease from
// publish to attach so that no one deletes the snapshot under the
// recorder; the returned job ends the lease when the recording is done.
func (n *Node) ImportAndRecord(ctx context.Context, req repository.PublishRequest) (repository.Record, *recorder.Job, error) {
	// The record says a recording was asked for, so that a daemon resumes
	// it should this process die before the manifest is attached.
	req.RecordManifest = true
	lease, err := n.Repo.BeginCapture(ctx)
	if err != nil {
		return repository.Record{}, nil, err
	}
	rec, err := n.Repo.Publish(ctx, lease, req)
	if err != nil {
		lease.End()
		return repository.Record{}, nil, err
	}
	return rec, n.Recorder.Start(ctx, lease), nil
}
