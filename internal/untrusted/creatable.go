package untrusted

import (
	"fmt"
	"os"
	"path/filepath"
)

// CheckCreatable refuses an output path that a later durable write (a
// temporary file in the same directory, renamed over path) could not make:
// a directory path itself, or a parent that is missing, no directory, or
// refuses new files. Verbs write their reports after the work they
// describe, so this lets them refuse a bad path before any work. The
// parent is probed by creating and removing a temporary file, because
// access(2) says yes to root even where creation fails (/proc, /sys).
func CheckCreatable(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return fmt.Errorf("%s: is a directory", path)
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("%s: directory %s: %w", path, dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s: directory %s: not a directory", path, dir)
	}
	probe, err := os.CreateTemp(dir, ".warmstart-probe-*")
	if err != nil {
		return fmt.Errorf("%s: directory %s does not take new files: %w", path, dir, err)
	}
	name := probe.Name()
	probe.Close()
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("%s: remove probe %s: %w", path, name, err)
	}
	return nil
}
