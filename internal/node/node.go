// Package node assembles the parts of a warmstart node from a
// configuration: the FUSE memory device mount, the prefetch engine, the
// restorer, the recorder's tracing restorer and the recorder, the learner
// of refined manifests, the VMM driver and the metrics hook. The daemon,
// every CLI verb, the benchmark, the demo and the S3 benchmark get their
// parts here and nowhere else, so the wiring exists once and cannot drift
// between them. The operations
// that need several of those parts at once (Capture, ImportAndRecord) live
// here too.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/learner"
	"warmstart/internal/memdev"
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/memdev/uffd"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/refine"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/trust"
	"warmstart/internal/vmm"
	"warmstart/internal/vmm/qemu"
)

// Metrics is what a node reports to: every restore decision of the serving
// restorer, and the latency of every repository operation.
type Metrics interface {
	restore.Observer
	Repository(repository.Repository) repository.Repository
}

// Options say where a node lives and which parts the caller brings.
type Options struct {
	// Config is the loaded configuration; required.
	Config *config.Config
	// Repository keeps the snapshots; required (OpenRepository opens the
	// configured one).
	Repository repository.Repository
	// RuntimeDir holds a private directory per restore; required. It is
	// created (mode 0700) when missing.
	RuntimeDir string
	// FUSEMount is where the file device is mounted; RuntimeDir/mem when
	// empty.
	FUSEMount string
	// TraceMount is where the recorder's tracing device is mounted;
	// RuntimeDir/trace-mem when empty.
	TraceMount string
	// PrefetchMount is where the file device of restores that prefetch is
	// mounted, when its readaround window differs from the serving
	// mount's; FUSEMount-prefetching when empty.
	PrefetchMount string
	// VMM restores the snapshots; NewVMM builds the configured one when nil.
	VMM vmm.VMM
	// FUSE are the serving mount's options (tests hold reads in its
	// ReadHook); AllowWriteOpen is added on both mounts for QEMU.
	FUSE fusedev.Options
	// Log receives the parts' logs; nil discards them.
	Log *slog.Logger
	// RemoveRuntimeDir makes Close remove RuntimeDir once everything in it
	// is unmounted (a CLI process's private directory).
	RemoveRuntimeDir bool
	// ReadOnly says the repository takes no writes (a CLI restore opens
	// it so): restores still prefetch the refined manifest a snapshot
	// has, but nothing learns, since every attach would fail.
	ReadOnly bool
	// Metrics, when set, is called with the node's prefetch engine and
	// returns what the serving restorer and the repository report to.
	Metrics func(*prefetch.Engine) Metrics
}

// Node is an assembled node. Its fields are the parts; Close undoes them.
type Node struct {
	Config *config.Config
	// Repo is Options.Repository, timed by Metrics when it is set.
	Repo repository.Repository
	VMM  vmm.VMM
	FUSE *fusedev.Server
	// PrefetchFUSE serves the restores that prefetch; nil when FUSE does
	// (its readaround window is the same).
	PrefetchFUSE *fusedev.Server
	Engine       *prefetch.Engine
	Restorer     *restore.Restorer
	// Recorder records startup manifests through its own tracing mount.
	Recorder *recorder.Recorder
	// Learner refines startup manifests from restores (Learn); nil when
	// [snapshot.memory_startup_pack] refine is off.
	Learner *learner.Learner
	// Metrics is what Options.Metrics returned, or nil.
	Metrics Metrics
	// Trust is the node's policy ([trust] trusted_keys): its restorers
	// refuse what none of its keys signed.
	Trust *trust.Policy

	closers []func() error
}

// Open assembles a node. On error nothing of it is left mounted.
func Open(ctx context.Context, o Options) (_ *Node, err error) {
	if o.Config == nil || o.Repository == nil || o.RuntimeDir == "" {
		return nil, errors.New("node: Config, Repository and RuntimeDir are required")
	}
	n := &Node{Config: o.Config, Repo: o.Repository, VMM: o.VMM}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if n.Trust, err = TrustPolicy(o.Config); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if n.VMM == nil {
		if n.VMM, err = NewVMM(ctx, o.Config); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(o.RuntimeDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: runtime directory: %w", err)
	}
	if o.RemoveRuntimeDir {
		n.closers = append(n.closers, func() error { return os.RemoveAll(o.RuntimeDir) })
	}
	n.Engine = NewEngine(o.Config)
	if o.Metrics != nil {
		n.Metrics = o.Metrics(n.Engine)
		n.Repo = n.Metrics.Repository(n.Repo)
	}
	if err := n.mount(o); err != nil {
		return nil, err
	}
	if o.Config.Snapshot.MemoryStartupPack.Refine && !o.ReadOnly {
		n.Learner = learner.New(n.Repo, o.Log, refine.Options{})
		// Closed first: it stops taking lessons before anything else goes.
		n.closers = append(n.closers, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), LearnerCloseTimeout)
			defer cancel()
			return n.Learner.Close(ctx)
		})
	}
	return n, nil
}

// LearnerCloseTimeout bounds how long Close applies the observations
// still queued: a stopping node does not wait on learning for long.
const LearnerCloseTimeout = 10 * time.Second

// Learn hands a ready restore's observation to the learner, in the
// background: nothing when refine is off or the restore did not prefetch.
func (n *Node) Learn(snapshotID string, inst *restore.Instance) {
	if n.Learner == nil || inst.Observation == nil {
		return
	}
	n.Learner.Submit(learner.Observed{SnapshotID: snapshotID, Observation: *inst.Observation})
}

// mount mounts the serving device and the tracing device and builds the
// restorers and the recorder on them.
func (n *Node) mount(o Options) error {
	cfg, log := o.Config, o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	serving := FUSEOptions(o.FUSE, n.VMM)
	serving.Log = log
	if serving.ReadAheadBytes == 0 {
		serving.ReadAheadBytes = cfg.Memory.ReadaroundBytes(cfg.Snapshot.RepositoryBackend)
	}
	servingDir := orDefault(o.FUSEMount, filepath.Join(o.RuntimeDir, "mem"))
	var err error
	if n.FUSE, err = fusedev.Mount(servingDir, serving); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.closers = append(n.closers, n.FUSE.Close)
	if n.PrefetchFUSE, err = MountPrefetching(orDefault(o.PrefetchMount, servingDir+"-prefetching"), n.FUSE, serving, cfg.Memory.PrefetchReadaroundBytes()); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if n.PrefetchFUSE != nil {
		n.closers = append(n.closers, n.PrefetchFUSE.Close)
	}
	n.Restorer = &restore.Restorer{
		Devices:        memdev.Devices{fusedev.NewOpener(n.FUSE, n.PrefetchFUSE), uffd.NewOpener(cfg.Memory.UffdConnectTimeout)},
		Engine:         n.Engine,
		VMM:            n.VMM,
		ConsumeEnabled: cfg.Snapshot.MemoryStartupPack.ConsumeEnabled,
		Refine:         cfg.Snapshot.MemoryStartupPack.Refine,
		RuntimeDir:     o.RuntimeDir,
		Log:            log,
		Trust:          n.Trust,
	}
	if n.Metrics != nil {
		n.Restorer.Observe = n.Metrics
	}
	// The tracing mount takes the serving mount's AllowWriteOpen (the same
	// VMM restores on it) but not its test hooks.
	tracing, closeTracing, err := recorder.TracingRestorerWith(n.Restorer,
		orDefault(o.TraceMount, filepath.Join(o.RuntimeDir, "trace-mem")),
		fusedev.Options{AllowWriteOpen: serving.AllowWriteOpen, Log: log})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.closers = append(n.closers, closeTracing)
	n.Recorder = &recorder.Recorder{
		Repo:     n.Repo,
		Restorer: tracing,
		Device:   cfg.Memory.Device,
		IOEngine: cfg.Memory.IOEngine,
		Log:      log,
		Timeout:  RecordTimeout(cfg),
		// Each run restores the snapshot once more, within its own
		// Timeout, under the same capture lease.
		Recordings: int(cfg.Snapshot.MemoryStartupPack.Recordings),
	}
	return nil
}

// RecordTimeout bounds each traced restore of a recording: twice the time
// a guest agent gets to answer, so a guest that never becomes ready does
// not hold the snapshot's capture lease forever.
func RecordTimeout(cfg *config.Config) time.Duration { return 2 * cfg.Envd.Timeout }

// NewEngine is the prefetch engine [prefetch] configures.
func NewEngine(cfg *config.Config) *prefetch.Engine {
	return prefetch.NewEngine(prefetch.Options{MaxReaders: cfg.Prefetch.MaxReaders, BufferBytes: int(cfg.Prefetch.BufferBytes)})
}

// MountPrefetching mounts at dir the file device of restores that
// prefetch: serving's options (opts) with their readaround window
// (config.MemoryConfig.PrefetchReadaroundBytes). It returns nil, nil when
// the serving mount's window is that one already: the serving mount then
// serves those restores too.
func MountPrefetching(dir string, serving *fusedev.Server, opts fusedev.Options, window int) (*fusedev.Server, error) {
	if serving.ReadAheadBytes() == window {
		return nil, nil
	}
	opts.ReadAheadBytes = window
	srv, err := fusedev.Mount(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("prefetching mount: %w", err)
	}
	return srv, nil
}

// FUSEOptions are base, with writable opens when vm is QEMU, which opens
// its memory file read-write before it maps it private (the device still
// refuses writes).
func FUSEOptions(base fusedev.Options, vm vmm.VMM) fusedev.Options {
	if _, ok := vm.(*qemu.Driver); ok {
		base.AllowWriteOpen = true
	}
	return base
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Close undoes Open in reverse: the tracing mount, then the serving FUSE
// mount last (only the runtime directory, when the node owns it, goes
// after it, since the mounts live in it). It is safe to call more than once.
func (n *Node) Close() error {
	var errs []error
	for i := len(n.closers) - 1; i >= 0; i-- {
		errs = append(errs, n.closers[i]())
	}
	n.closers = nil
	return errors.Join(errs...)
}

// Resolve turns an id or alias into a restore source.
func (n *Node) Resolve(ctx context.Context, ref string) (restore.Source, error) {
	rec, err := n.Repo.Lookup(ctx, ref)
	if err != nil {
		return restore.Source{}, fmt.Errorf("snapshot %s: %w", ref, err)
	}
	res, err := n.Repo.Resolve(ctx, rec.ID)
	if err != nil {
		return restore.Source{}, fmt.Errorf("snapshot %s: %w", ref, err)
	}
	return restore.SourceIn(ctx, n.Repo, res), nil
}
