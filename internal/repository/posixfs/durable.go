package posixfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"warmstart/internal/durable"
)

// Durable writes follow one order: write a temporary file in the target's
// directory, fsync it, rename it over the target, fsync the directory. A
// crash before the rename leaves only a temporary file, which readers
// ignore and the sweep removes; a crash after it leaves the whole new file.

const (
	catalogFileMode = 0o644
	// dirMode keeps the store to its owner: artifacts hold guest memory.
	dirMode = 0o700
)

// faultPoints names the fault points of one durable write: the first fires
// once the temporary file is synced, the second once it has been renamed
// (before the directory is synced). Empty names fire nothing.
type faultPoints struct{ afterTemp, afterRename string }

// writeFileDurable replaces dir/name with data. It never creates dir: a
// snapshot directory that was deleted stays deleted.
func (r *Repo) writeFileDurable(dir, name string, data []byte, mode os.FileMode, fp faultPoints) error {
	tmp := filepath.Join(dir, tempName(name))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	committed := false
	defer func() {
		if !committed {
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	r.fault(fp.afterTemp)
	target := filepath.Join(dir, name)
	if err := os.Rename(tmp, target); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, target, err)
	}
	committed = true
	r.fault(fp.afterRename)
	return durable.Sync(dir)
}

// removeDurable removes dir/name and syncs dir; a missing file is not an
// error. It reports whether a file was removed.
func removeDurable(dir, name string) (bool, error) {
	path := filepath.Join(dir, name)
	if err := os.Remove(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("remove %s: %w", path, err)
	}
	return true, durable.Sync(dir)
}
