// Package durable writes files so that a crash leaves either the old file
// or the whole new one, never a part: the bytes go to a temporary file in
// the same directory, which is synced and renamed into place, and then
// the directory is synced so the rename itself survives.
package durable

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// WriteFile replaces path with what fill writes, with permissions perm.
// On any error the temporary file is removed and path is left as it was.
func WriteFile(path string, perm os.FileMode, fill func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := fill(tmp); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return Sync(dir)
}

// WriteBytes replaces path with data, with permissions perm (WriteFile).
func WriteBytes(path string, perm os.FileMode, data []byte) error {
	return WriteFile(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Sync syncs the file or directory at path: a file's bytes, or a
// directory's entries (creations, renames, removals), become durable.
func Sync(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}
