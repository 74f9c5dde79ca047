package ops

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"warmstart/internal/api"
	"warmstart/internal/pause"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// ErrPauseUnsupported is a pause on a repository that cannot store layers.
var ErrPauseUnsupported = fmt.Errorf("%w: this repository cannot store paused children", repository.ErrUnsupported)

// CheckPauseRequest refuses a malformed pause request, in a *FieldError
// naming the field.
func CheckPauseRequest(req api.PauseRequest) error {
	switch req.Then {
	case "", api.ThenResume, api.ThenStop:
	default:
		return JSONFields.fieldError("then", fmt.Errorf("then %q: want %q or %q", req.Then, api.ThenResume, api.ThenStop))
	}
	if req.Alias != "" {
		if err := repository.ValidateNewAlias(req.Alias); err != nil {
			return JSONFields.fieldError("alias", err)
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
	step := ""
	onStep := func(s string) {
		step = s
		if opts.OnStep != nil {
			opts.OnStep(s)
		}
	}
	res, err := pause.Run(ctx, lr, inst, pause.Request{Alias: req.Alias, Stop: req.Then == api.ThenStop},
		pause.Options{StagingDir: opts.StagingDir, MaxDepth: opts.MaxDepth, OnStep: onStep})
	if err != nil {
		return api.PauseResult{}, stagingFull(err, step, opts.StagingDir)
	}
	return api.PauseResult{Snapshot: res.Child.ID, Alias: res.Child.Alias, Parent: res.Parent, Depth: res.Child.Depth(),
		Flattened: res.Flattened, Pages: res.Pages, Timings: res.Timings}, nil
}

// stagingFull names the staging directory in a pause's error when it is
// what ran out of space: a write of ours there failed with ENOSPC or
// EDQUOT, or the VMM failed to save the VM into it (its error is the
// VMM's text, without the errno) while its file system has no block or
// inode left. The error then matches syscall.ENOSPC (or EDQUOT). Any other
// error is returned as it is; one that ran out of space in the store
// names the store's path already.
func stagingFull(err error, step, dir string) error {
	noSpace := errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
	switch {
	case noSpace && under(failedPath(err), dir):
	case !noSpace && step == pause.StepPause && fsFull(dir):
		err = &fullFSError{err: err}
	default:
		return err
	}
	return fmt.Errorf("the pause's staging directory %s ([runtime] dir) has no space left: %w", dir, err)
}

// failedPath is the path of the first file operation that failed in err's
// chain, "" when there is none.
func failedPath(err error) string {
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		return pe.Path
	}
	if le := (*os.LinkError)(nil); errors.As(err, &le) {
		return le.New
	}
	return ""
}

// under reports whether path is dir or lies beneath it.
func under(path, dir string) bool {
	if path == "" || dir == "" {
		return false
	}
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// fsFull reports whether dir's file system has no block or no inode left
// for an unprivileged writer.
func fsFull(dir string) bool {
	var st unix.Statfs_t
	if dir == "" || unix.Statfs(dir, &st) != nil {
		return false
	}
	return st.Bavail == 0 || (st.Files > 0 && st.Ffree == 0)
}

// fullFSError is a failure of the VMM while its file system was full: the
// VMM's error, which matches syscall.ENOSPC as our own writes' do.
type fullFSError struct{ err error }

func (e *fullFSError) Error() string        { return e.err.Error() }
func (e *fullFSError) Unwrap() error        { return e.err }
func (e *fullFSError) Is(target error) bool { return target == syscall.ENOSPC }
