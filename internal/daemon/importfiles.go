package daemon

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"warmstart/internal/api"
	"warmstart/internal/untrusted"
)

// importFiles are the two files an API import names, opened once, when
// they are checked, and read through those open files until the publish
// ends: the daemon reads as root what a client names, so what it checks
// must be what it reads, whatever is renamed or swapped in meanwhile.
type importFiles struct {
	vmState, memory *os.File
}

func (in importFiles) Close() {
	for _, f := range []*os.File{in.vmState, in.memory} {
		if f != nil {
			f.Close()
		}
	}
}

// namedAsSent is err with the /proc/self/fd paths the repository was
// handed (procPath) named as the client sent them, its chain kept.
func (in importFiles) namedAsSent(err error, req api.ImportRequest) error {
	pairs := [][2]string{{procPath(in.vmState), req.VMState}, {procPath(in.memory), req.Memory}}
	// Longer first, so that /proc/self/fd/1 never matches inside /10.
	slices.SortFunc(pairs, func(a, b [2]string) int { return len(b[0]) - len(a[0]) })
	msg := strings.NewReplacer(pairs[0][0], pairs[0][1], pairs[1][0], pairs[1][1]).Replace(err.Error())
	return renamedError{msg: msg, err: err}
}

// renamedError is err with another message.
type renamedError struct {
	msg string
	err error
}

func (e renamedError) Error() string { return e.msg }
func (e renamedError) Unwrap() error { return e.err }

// procPath names an open file by its descriptor: opening, reading or
// hard-linking (with AT_SYMLINK_FOLLOW) that path reaches the open file
// itself, whatever its own path names now. The repository takes paths,
// so this is how it is handed the files the daemon checked. The file must
// stay open until the repository is done with the path.
func procPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// openImportable opens path for an import if it lies in one of [daemon]
// import_dirs, and answers 403 if it does not. The path must lie lexically
// in a directory, and is then resolved component by component beneath it
// (untrusted.OpenBeneath): a symlink or ".." that leads out is refused
// during the walk, with the same 403 as any outside path, so a client
// learns nothing of what is outside (not whether it exists, nor its type
// or size), and nothing outside is ever looked at. Relative symlinks that
// stay inside the directory are followed; an absolute one is refused even
// when it names a file inside (the kernel's walk cannot tell without
// looking), and so is one leading into another import dir. Only a file
// inside gets the 400s for a missing, empty or non-regular file.
func (d *Daemon) openImportable(field, path string) (*os.File, error) {
	if path == "" {
		return nil, badRequest(field, "%s is required", field)
	}
	if !filepath.IsAbs(path) {
		return nil, badRequest(field, "%s %q: want an absolute path on the daemon's host", field, path)
	}
	if len(d.cfg.Daemon.ImportDirs) == 0 {
		return nil, statusError(http.StatusForbidden, field,
			errors.New("imports over the API are off: list the directories they may read in [daemon] import_dirs"))
	}
	// No other walk is tried where this one refuses: resolving the path
	// any other way (filepath.EvalSymlinks) looks at what lies outside,
	// as root, and its answer would tell (or hang on) what is there.
	f, err := d.openBeneathImportDirs(filepath.Clean(path))
	switch {
	case errors.Is(err, untrusted.ErrOutside):
		// Short: an error body quotes at most maxEchoBytes of a path.
		return nil, statusError(http.StatusForbidden, field, fmt.Errorf("%s %s is outside [daemon] import_dirs (no absolute symlinks)", field, path))
	case errors.Is(err, untrusted.ErrNoOpenat2):
		return nil, fmt.Errorf("%s: %w", field, err) // the host's, not the client's
	case err != nil:
		return nil, statusError(http.StatusBadRequest, field, fmt.Errorf("%s: %w", field, err))
	}
	if err := checkImportFile(f, path); err != nil {
		f.Close()
		return nil, statusError(http.StatusBadRequest, field, fmt.Errorf("%s: %w", field, err))
	}
	return f, nil
}

// openBeneathImportDirs opens the clean path beneath the first import dir
// it lies in that the walk does not lead out of; ErrOutside when none.
func (d *Daemon) openBeneathImportDirs(clean string) (*os.File, error) {
	for _, root := range d.importRoots() {
		rel, ok := strictlyBelow(root, clean)
		if !ok {
			continue
		}
		f, err := untrusted.OpenBeneath(root, rel)
		if !errors.Is(err, untrusted.ErrOutside) {
			return f, err
		}
	}
	return nil, untrusted.ErrOutside
}

// importRoots are the import dirs as configured and as resolved (an import
// dir may itself be a symlink the operator chose).
func (d *Daemon) importRoots() []string {
	var roots []string
	for _, dir := range d.cfg.Daemon.ImportDirs {
		roots = append(roots, filepath.Clean(dir))
		if real, err := filepath.EvalSymlinks(dir); err == nil && real != filepath.Clean(dir) {
			roots = append(roots, real)
		}
	}
	return roots
}

// strictlyBelow returns path relative to root when the clean absolute
// path lies strictly below root.
func strictlyBelow(root, path string) (string, bool) {
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return rel, true
}

// checkImportFile refuses an open regular file, which the client named
// path, that cannot be a snapshot artifact: an empty one, or one on a
// pseudo file system.
func checkImportFile(f *os.File, path string) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if fi.Size() == 0 {
		return fmt.Errorf("%s is empty", path)
	}
	if err := untrusted.CheckFileOnDisk(f); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
