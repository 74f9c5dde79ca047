package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"warmstart/internal/config"
	"warmstart/internal/logging"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/qemu"
	"warmstart/internal/vmm/replay"
)

// system is everything an in-process verb needs to restore: the
// configuration, the repository, one FUSE mount, one prefetch engine and a
// VMM driver. close undoes it all, unmounting FUSE last.
type system struct {
	cfg      *config.Config
	repo     repository.Repository
	fuse     *fusedev.Server
	restorer *restore.Restorer
	recorder *recorder.Recorder
	log      *slog.Logger
	closers  []func()
}

// vmmFlags are the flags that choose and feed a VMM driver.
type vmmFlags struct {
	kind  string
	trace string
	// readOnly opens the repository read-only (restore only reads it).
	readOnly bool
}

func (f *vmmFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.kind, "vmm", "replay", "VMM driver: replay (stand-in process), qemu or firecracker")
	cmd.Flags().StringVar(&f.trace, "trace", "", "startup trace the replay VMM plays (from warmstart synth)")
}

func (f *vmmFlags) build(cfg *config.Config) (vmm.VMM, error) {
	switch f.kind {
	case "replay":
		if f.trace == "" {
			return nil, usageError{fmt.Errorf("--vmm replay needs --trace FILE (warmstart synth writes one)")}
		}
		if _, err := os.Stat(f.trace); err != nil {
			return nil, fmt.Errorf("--trace: %w", err)
		}
		return &replay.VMM{TracePath: f.trace}, nil
	case "qemu":
		return newQEMUDriver(cfg)
	case "firecracker":
		return newFirecrackerDriver(cfg)
	default:
		return nil, usageError{fmt.Errorf("--vmm %q: want replay, qemu or firecracker", f.kind)}
	}
}

// fuseOptions are the options the chosen VMM needs of the FUSE mounts that
// serve its memory: QEMU opens the device file read-write before it maps
// it private.
func (f *vmmFlags) fuseOptions() fusedev.Options {
	return fusedev.Options{AllowWriteOpen: f.kind == "qemu"}
}

// newQEMUDriver builds the qemu driver from [qemu] with its accelerator
// resolved: "auto" probes the host here, once, rather than inside the
// first timed restore. A snapshot restores only under the accelerator,
// memory size and vCPU count it was captured with.
func newQEMUDriver(cfg *config.Config) (*qemu.Driver, error) {
	d, err := qemu.New(qemu.Options{
		Binary:      cfg.QEMU.Binary,
		Accel:       cfg.QEMU.Accel,
		Kernel:      cfg.QEMU.Kernel,
		MemoryMiB:   int(cfg.QEMU.MemoryMiB),
		VCPUs:       cfg.QEMU.VCPUs,
		StopTimeout: cfg.QEMU.StopTimeout,
	})
	if err != nil {
		return nil, err
	}
	accel, err := d.Accel(context.Background())
	if err != nil {
		return nil, fmt.Errorf("qemu driver: %w", err)
	}
	opts := d.Options()
	opts.Accel = accel
	return qemu.New(opts)
}

// openSystem builds the system from --config. The FUSE mount lives under
// the runtime directory, private to this process so verbs run side by side.
func openSystem(cmd *cobra.Command, vf *vmmFlags) (*system, error) {
	cfg, err := config.Load(configPath)
	if err != nil {
		return nil, err
	}
	s := &system{cfg: cfg}
	if s.log, err = logging.New(os.Stderr, cfg.Log); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.close()
		}
	}()
	if s.repo, err = openRepositoryAs(cmd, vf.readOnly); err != nil {
		return nil, err
	}
	vm, err := vf.build(cfg)
	if err != nil {
		return nil, err
	}
	sweepDeadCLIDirs(cfg.Runtime.Dir, s.log)
	run := filepath.Join(cfg.Runtime.Dir, cliDirPrefix+strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(run, 0o700); err != nil {
		return nil, fmt.Errorf("runtime directory: %w", err)
	}
	s.closers = append(s.closers, func() { os.RemoveAll(run) })
	if s.fuse, err = fusedev.Mount(filepath.Join(run, "mem"), vf.fuseOptions()); err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() { s.fuse.Close() })
	s.restorer = &restore.Restorer{
		FUSE:           s.fuse,
		Engine:         prefetch.NewEngine(prefetch.Options{MaxReaders: cfg.Prefetch.MaxReaders, BufferBytes: int(cfg.Prefetch.BufferBytes)}),
		VMM:            vm,
		ConsumeEnabled: cfg.Snapshot.MemoryStartupPack.ConsumeEnabled,
		RuntimeDir:     run,
		Log:            s.log,
		ConnectTimeout: cfg.Memory.UffdConnectTimeout,
	}
	tr, closeTr, err := recorder.TracingRestorerWith(s.restorer, filepath.Join(run, "trace-mem"), vf.fuseOptions())
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, func() { closeTr() })
	s.recorder = &recorder.Recorder{Repo: s.repo, Restorer: tr, Device: cfg.Memory.Device, IOEngine: cfg.Memory.IOEngine, Log: s.log}
	ok = true
	return s, nil
}

// cliDirPrefix and the process id name a CLI process's runtime directory.
const cliDirPrefix = "cli-"

// sweepDeadCLIDirs removes what CLI processes killed before they could
// clean up left under the runtime directory root: each cli-<pid> directory
// whose process is gone. Their FUSE mounts are dead (the server died with
// the process) and are detached first; a directory under which anything is
// still mounted is left alone. A pid reused by another process keeps its
// directory until that process is gone too. Failures are logged: they do
// not stop this process's own work.
func sweepDeadCLIDirs(root string, log *slog.Logger) {
	entries, err := os.ReadDir(root)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			log.Warn("sweep runtime directory", "dir", root, "error", err)
		}
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), cliDirPrefix))
		if !e.IsDir() || !strings.HasPrefix(e.Name(), cliDirPrefix) || err != nil || pid <= 0 || pid == os.Getpid() || processExists(pid) {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if err := fusedev.CleanStale(dir); err != nil {
			log.Warn("leaving a dead CLI's runtime directory", "dir", dir, "error", err)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("remove a dead CLI's runtime directory", "dir", dir, "error", err)
			continue
		}
		log.Info("removed a dead CLI's runtime directory", "dir", dir)
	}
}

// processExists reports whether a process with this id runs (possibly
// under another user).
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func (s *system) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// resolve turns an id or alias into a restore source.
func (s *system) resolve(ctx context.Context, ref string) (restore.Source, error) {
	rec, err := s.repo.Lookup(ctx, ref)
	if err != nil {
		return restore.Source{}, fmt.Errorf("snapshot %s: %w", ref, err)
	}
	res, err := s.repo.Resolve(ctx, rec.ID)
	if err != nil {
		return restore.Source{}, fmt.Errorf("snapshot %s: %w", ref, err)
	}
	return restore.SourceOf(res), nil
}
