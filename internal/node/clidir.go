package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"warmstart/internal/config"
	"warmstart/internal/logging"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/repository"
)

// CLIDirPrefix and the process id name a CLI process's runtime directory.
const CLIDirPrefix = "cli-"

// CLIRuntimeDir creates this process's private runtime directory under
// root, so CLI verbs run side by side, after sweeping what CLI processes
// killed before they could clean up left there.
func CLIRuntimeDir(root string, log *slog.Logger) (string, error) {
	SweepDeadCLIDirs(root, log)
	dir := filepath.Join(root, CLIDirPrefix+strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("runtime directory: %w", err)
	}
	return dir, nil
}

// SweepDeadCLIDirs removes what CLI processes killed before they could
// clean up left under the runtime directory root: each cli-<pid> directory
// whose process is gone. Their FUSE mounts are dead (the server died with
// the process) and are detached first; a directory under which anything is
// still mounted is left alone. A pid reused by another process keeps its
// directory until that process is gone too. Failures are logged: they do
// not stop this process's own work.
func SweepDeadCLIDirs(root string, log *slog.Logger) {
	entries, err := os.ReadDir(root)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("sweep runtime directory", "dir", root, "error", err)
		}
		return
	}
	for _, e := range entries {
		if e.IsDir() && deadCLIDir(e.Name()) {
			sweepCLIDir(filepath.Join(root, e.Name()), log)
		}
	}
}

// deadCLIDir reports whether name is the runtime directory of a CLI
// process that no longer runs.
func deadCLIDir(name string) bool {
	pid, err := strconv.Atoi(strings.TrimPrefix(name, CLIDirPrefix))
	return strings.HasPrefix(name, CLIDirPrefix) && err == nil && pid > 0 && pid != os.Getpid() && !processExists(pid)
}

func sweepCLIDir(dir string, log *slog.Logger) {
	if err := fusedev.CleanStale(dir); err != nil {
		log.Warn("leaving a dead CLI's runtime directory", "dir", dir, "error", err)
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		log.Warn("remove a dead CLI's runtime directory", "dir", dir, "error", err)
		return
	}
	log.Info("removed a dead CLI's runtime directory", "dir", dir)
}

// RemoveWorkDir removes a command's temporary directory. A child killed
// before it unmounted (a trial after a second signal) would leave a dead
// FUSE mount there, which RemoveAll cannot descend; such mounts are
// detached first, and a live one is reported rather than removed under.
func RemoveWorkDir(dir string) error {
	if err := fusedev.CleanStale(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// processExists reports whether a process with this id runs (possibly
// under another user).
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// OpenCLI assembles the node an in-process CLI verb works with: the VMM
// cfg names, logs on logOut, and FUSE mounts in a runtime directory
// private to this process (see CLIRuntimeDir), so verbs run side by side;
// Close removes that directory. readOnly is Options.ReadOnly.
func OpenCLI(ctx context.Context, cfg *config.Config, repo repository.Repository, readOnly bool, logOut io.Writer) (*Node, error) {
	log, err := logging.New(logOut, cfg.Log)
	if err != nil {
		return nil, err
	}
	vm, err := NewVMM(ctx, cfg)
	if err != nil {
		return nil, err
	}
	run, err := CLIRuntimeDir(cfg.Runtime.Dir, log)
	if err != nil {
		return nil, err
	}
	n, err := Open(ctx, Options{Config: cfg, Repository: repo, VMM: vm, RuntimeDir: run, RemoveRuntimeDir: true, ReadOnly: readOnly, Log: log})
	if err != nil {
		os.RemoveAll(run)
		return nil, err
	}
	// The verb's process owns the repository: Close closes it last, once
	// nothing reads through it, so an S3 node cache finishes writing the
	// blocks it was given before the process exits, rather than leaving
	// them half-written for the next verb to discard.
	if c, ok := repo.(io.Closer); ok {
		n.closers = append([]closer{{StepRepository, c.Close}}, n.closers...)
	}
	return n, nil
}
