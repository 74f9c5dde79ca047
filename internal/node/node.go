// Package node assembles the parts of a warmstart node from a
// configuration: the FUSE memory device mount, the prefetch engine, the
// restorer, the recorder's tracing restorer and the recorder, the learner
// of refined manifests, the VMM driver and the metrics hook. The daemon,
// every CLI verb, the benchmark, the demo and the S3 benchmark get their
// parts here and nowhere else, so the wiring exists once and cannot drift
// between them. What a node does with its parts (restore, import and
// record, capture) is package ops.
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
	"warmstart/internal/memdev/fusedev"
	"warmstart/internal/prefetch"
	"warmstart/internal/recorder"
	"warmstart/internal/refine"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/trust"
	"warmstart/internal/vmm"
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
	// [manifest] refine is off.
	Learner *learner.Learner
	// Metrics is what Options.Metrics returned, or nil.
	Metrics Metrics
	// Trust is the node's policy ([trust] trusted_keys): its restorers
	// refuse what none of its keys signed.
	Trust *trust.Policy

	closers []closer
}

// closer is one part Close undoes, named for the log.
type closer struct {
	step  string
	close func() error
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
		n.closers = append(n.closers, closer{StepRuntimeDir, func() error { return os.RemoveAll(o.RuntimeDir) }})
	}
	if err := n.mount(o); err != nil {
		return nil, err
	}
	if o.Config.Manifest.Refine && !o.ReadOnly {
		n.Learner = learner.New(n.Repo, o.Log, refine.Options{})
		// Closed first: it stops taking lessons before anything else goes.
		n.closers = append(n.closers, closer{StepRefinement, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), LearnerCloseTimeout)
			defer cancel()
			return n.Learner.Close(ctx)
		}})
	}
	return n, nil
}

// LearnerCloseTimeout bounds how long Close applies the observations
// still queued: a stopping node does not wait on learning for long.
const LearnerCloseTimeout = 10 * time.Second

// LearnerCloseBound is the longest Close waits for the learner: its
// queue, then a refinement that ignores the cancellation.
const LearnerCloseBound = LearnerCloseTimeout + learner.AbandonAfter

// The steps of Close, in its order, as CloseEach names them.
const (
	StepRefinement   = "refinement"
	StepTracingMount = "tracing mount"
	StepServingMount = "FUSE mount"
	StepRuntimeDir   = "runtime directory"
	// StepRepository closes a repository the node's process opened for
	// itself (a CLI verb's), last of all.
	StepRepository = "repository"
)

// Learn hands a ready restore's observation to the learner, in the
// background: nothing when refine is off or the restore did not prefetch.
func (n *Node) Learn(snapshotID string, inst *restore.Instance) {
	if n.Learner == nil || inst.Observation == nil {
		return
	}
	n.Learner.Submit(learner.Observed{SnapshotID: snapshotID, Observation: *inst.Observation})
}

// restorerOptions are the serving restorer's, from the configuration.
func (n *Node) restorerOptions(o Options, log *slog.Logger) RestorerOptions {
	cfg := o.Config
	serving := o.FUSE
	serving.Log = log
	if serving.ReadAheadBytes == 0 {
		serving.ReadAheadBytes = cfg.Memory.ReadaroundBytes(cfg.Snapshot.RepositoryBackend)
	}
	serving.Passthrough = serving.Passthrough || cfg.Memory.Passthrough
	return RestorerOptions{
		VMM:                    n.VMM,
		RuntimeDir:             o.RuntimeDir,
		Mount:                  orDefault(o.FUSEMount, filepath.Join(o.RuntimeDir, config.DefaultFUSEMountName)),
		PrefetchMount:          o.PrefetchMount,
		FUSE:                   serving,
		PrefetchReadAheadBytes: cfg.Memory.PrefetchReadaroundBytes(),
		Engine:                 EngineOptions(cfg),
		ConsumeEnabled:         cfg.Prefetch.OnRestore,
		Refine:                 cfg.Manifest.Refine,
		UffdConnectTimeout:     cfg.Memory.UffdConnectTimeout,
		Log:                    log,
		Trust:                  n.Trust,
	}
}

// mount assembles the serving restorer and its mounts, the metrics that
// watch its engine, and the recorder on a tracing restorer of its own.
func (n *Node) mount(o Options) error {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ro := n.restorerOptions(o, log)
	serving, err := OpenRestorer(ro)
	if err != nil {
		return err
	}
	n.closers = append(n.closers, closer{StepServingMount, serving.Close})
	n.Restorer, n.FUSE, n.PrefetchFUSE, n.Engine = serving.Restorer, serving.FUSE, serving.PrefetchFUSE, serving.Restorer.Engine
	if o.Metrics != nil {
		n.Metrics = o.Metrics(n.Engine)
		n.Repo = n.Metrics.Repository(n.Repo)
		n.Restorer.Observe = n.Metrics
	}
	tracing, err := OpenRestorer(TracingOptions(ro, orDefault(o.TraceMount, filepath.Join(o.RuntimeDir, "trace-mem"))))
	if err != nil {
		return err
	}
	n.closers = append(n.closers, closer{StepTracingMount, tracing.Close})
	cfg := o.Config
	n.Recorder = &recorder.Recorder{
		Repo:     n.Repo,
		Restorer: tracing.Restorer,
		Device:   cfg.Memory.Device,
		IOEngine: int(cfg.Memory.IOEngine),
		Log:      log,
		Timeout:  RecordTimeout(cfg),
		// Each run restores the snapshot once more, within its own
		// Timeout, under the same capture lease.
		Recordings: int(cfg.Manifest.Recordings),
	}
	return nil
}

// RecordTimeout bounds each traced restore of a recording: twice the time
// a guest agent gets to answer, so a guest that never becomes ready does
// not hold the snapshot's capture lease forever.
func RecordTimeout(cfg *config.Config) time.Duration { return 2 * cfg.Agent.Timeout }

// EngineOptions are the prefetch engine's options [prefetch] configures.
func EngineOptions(cfg *config.Config) prefetch.Options {
	return prefetch.Options{MaxReaders: cfg.Prefetch.MaxReaders, BufferBytes: int(cfg.Prefetch.BufferBytes)}
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
	n.CloseEach(func(step string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", step, err))
		}
	})
	return errors.Join(errs...)
}

// CloseEach is Close telling done of each step as it ends, with its
// error: every step runs, whatever became of those before it.
func (n *Node) CloseEach(done func(step string, err error)) {
	for i := len(n.closers) - 1; i >= 0; i-- {
		c := n.closers[i]
		done(c.step, c.close())
	}
	n.closers = nil
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
