package ops

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"warmstart/internal/manifest"
	"warmstart/internal/repository"
)

// InspectManifest reads the manifest ref names for `manifest inspect`: a
// file, or when nothing but a directory of that name exists (a directory
// is never a manifest, and a snapshot's synth output is often named like
// its alias), the manifest attached to the snapshot with that id or alias
// (repository.ReadManifest), checked against its record's digest. It
// returns where it was read, its bytes and what they decode to. openRepo
// opens the repository read-only, only for a snapshot ref.
func InspectManifest(ctx context.Context, ref string, openRepo func() (repository.Repository, error)) (string, []byte, *manifest.Manifest, error) {
	if fi, err := os.Lstat(ref); (err == nil && !fi.IsDir()) || strings.ContainsRune(ref, '/') {
		data, err := manifest.ReadFile(ref)
		if err != nil {
			return "", nil, nil, fmt.Errorf("manifest inspect: %w", err)
		}
		m, err := manifest.Decode(data)
		if err != nil {
			return "", nil, nil, fmt.Errorf("manifest %s: %w", ref, err)
		}
		return ref, data, m, nil
	}
	if err := repository.ValidateRef(ref); err != nil {
		// Most likely a mistyped file name: a failure to find it, not a
		// malformed call (the error does not wrap ErrInvalidRequest).
		return "", nil, nil, fmt.Errorf("manifest %s: no such file, and not a snapshot id or alias (%v)", ref, err)
	}
	repo, err := openRepo()
	if err != nil {
		return "", nil, nil, err
	}
	if c, ok := repo.(io.Closer); ok {
		defer c.Close()
	}
	return repository.ReadManifest(ctx, repo, ref)
}
