package s3

import (
	"context"
	"fmt"

	"warmstart/internal/repository"
)

// PublishLayer implements repository.Layers.
func (r *Repo) PublishLayer(ctx context.Context, lz repository.Lease, req repository.LayerPublishRequest) (repository.Record, error) {
	return repository.Record{}, fmt.Errorf("publish layer: %w", repository.ErrUnsupported)
}

// ReplaceMemory implements repository.Layers.
func (r *Repo) ReplaceMemory(ctx context.Context, lz repository.Lease, req repository.ReplaceMemoryRequest) (repository.Record, error) {
	return repository.Record{}, fmt.Errorf("replace memory: %w", repository.ErrUnsupported)
}

// Dependents implements repository.Layers.
func (r *Repo) Dependents(ctx context.Context, id string) (live, inProgress []string, err error) {
	return nil, nil, fmt.Errorf("dependents: %w", repository.ErrUnsupported)
}
