package ops

import (
	"context"
	"fmt"

	"warmstart/internal/api"
	"warmstart/internal/pause"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// ErrPauseUnsupported is a pause on a repository that cannot store layers.
var ErrPauseUnsupported = fmt.Errorf("%w: this repository cannot store paused children", repository.ErrUnsupported)

// CheckPauseRequest refuses a malformed pause request.
func CheckPauseRequest(req api.PauseRequest) error {
	switch req.Then {
	case "", api.ThenResume, api.ThenStop:
	default:
		return fmt.Errorf("then %q: want %q or %q", req.Then, api.ThenResume, api.ThenStop)
	}
	if req.Alias != "" {
		if err := repository.ValidateAlias(req.Alias); err != nil {
			return err
		}
	}
	return nil
}

// PauseOptions are how a pause runs on this node.
type PauseOptions struct {
	// StagingDir holds the pause's files until the child is published.
	StagingDir string
	// MaxDepth is [pause] max_depth (pause.Options.MaxDepth).
	MaxDepth int
	// OnStep, when set, is told of each step before it starts.
	OnStep func(step string)
}

// Pause pauses inst into a child snapshot in repo. With then=stop the
// VM is left paused for the caller to stop (it runs again on failure).
func Pause(ctx context.Context, repo repository.Repository, inst *restore.Instance, req api.PauseRequest, opts PauseOptions) (api.PauseResult, error) {
	if err := CheckPauseRequest(req); err != nil {
		return api.PauseResult{}, err
	}
	lr, ok := repo.(pause.Repository)
	if !ok {
		return api.PauseResult{}, ErrPauseUnsupported
	}
	res, err := pause.Run(ctx, lr, inst, pause.Request{Alias: req.Alias, Stop: req.Then == api.ThenStop},
		pause.Options{StagingDir: opts.StagingDir, MaxDepth: opts.MaxDepth, OnStep: opts.OnStep})
	if err != nil {
		return api.PauseResult{}, err
	}
	return api.PauseResult{Snapshot: res.Child.ID, Alias: res.Child.Alias, Parent: res.Parent, Depth: res.Child.Depth(),
		Flattened: res.Flattened, Pages: res.Pages, Timings: res.Timings}, nil
}
