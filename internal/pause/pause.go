package pause

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"warmstart/internal/layers"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// Steps of a pause, in order, as Options.OnStep is told of them (each
// just before it starts).
const (
	StepLease    = "lease"
	StepPause    = "pause"
	StepResume   = "resume"
	StepLayer    = "layer"
	StepManifest = "manifest"
	StepPublish  = "publish"
	StepEnd      = "end"
)

// StagingPrefix begins the name of a pause's staging directory under
// Options.StagingDir.
const StagingPrefix = "pause-"

// Steps lists every step in order.
var Steps = []string{StepLease, StepPause, StepResume, StepLayer, StepManifest, StepPublish, StepEnd}

// Repository is what a pause needs of the repository.
type Repository interface {
	repository.Repository
	repository.Layers
}

// Request is one pause.
type Request struct {
	// Alias is bound to the child when not empty.
	Alias string
	// Stop leaves the VM paused after its state is saved, for the caller
	// to stop once the child is published; false resumes it at once.
	Stop bool
}

// Options are how a pause runs.
type Options struct {
	// StagingDir is an existing directory for the pause's files (one
	// subdirectory per pause, removed at the end).
	StagingDir string
	// OnStep, when set, is told of each step before it starts.
	OnStep func(step string)
	// ManifestExtraPercent caps the written pages of the child's harvested
	// manifest at this share of its startup path; 0 is
	// DefaultExtraPercent, negative none.
	ManifestExtraPercent int
	// MaxDepth bounds the child's diff layers ([pause] max_depth; 0 is
	// DefaultMaxDepth): a child that would have more is published with
	// one layer over its chain's base, merging the parent's diff layers
	// and the changed pages (Result.Flattened).
	MaxDepth int
}

func (o Options) extraPercent() int {
	switch {
	case o.ManifestExtraPercent == 0:
		return DefaultExtraPercent
	case o.ManifestExtraPercent < 0:
		return 0
	}
	return o.ManifestExtraPercent
}

// Timings are how long each part of a pause took.
type Timings struct {
	// Paused is the VM's paused window (with Stop: until the state was
	// saved); Freeze its part saving device state and changed pages.
	Paused time.Duration `json:"paused_ns"`
	Freeze time.Duration `json:"freeze_ns"`
	Layer  time.Duration `json:"layer_ns"`
	// Publish is the repository's part; Total from the start to the
	// child's record.
	Publish time.Duration `json:"publish_ns"`
	Total   time.Duration `json:"total_ns"`
}

// Result is a published child.
type Result struct {
	Child  repository.Record
	Parent string
	// Pages are the changed pages' counts (of the new pages, also when
	// they were merged).
	Pages   layers.Counts
	Timings Timings
	// Flattened says the child would have passed the depth bound and was
	// published with one merged diff layer over its chain's base.
	Flattened bool
}

// Run pauses inst into a child of the snapshot it was restored from (or
// last rebased on), publishes it in repo and rebases inst on it. With
// req.Stop the VM is left paused on success (the caller stops it); on any
// failure the VM runs again.
func Run(ctx context.Context, repo Repository, inst *restore.Instance, req Request, opts Options) (res Result, err error) {
	t0 := time.Now()
	step := func(s string) {
		if opts.OnStep != nil {
			opts.OnStep(s)
		}
	}
	if !inst.Pausable() {
		return res, fmt.Errorf("pause: restore %s: %w (restore with pausable: true)", inst.ID, restore.ErrNotPausable)
	}
	parent, res2, err := checkParent(ctx, repo, inst.Base(), req.Alias)
	if err != nil {
		return res, err
	}
	step(StepLease)
	lease, err := repo.BeginCapture(ctx)
	if err != nil {
		return res, fmt.Errorf("pause: %w", err)
	}
	defer lease.End()
	dir, err := os.MkdirTemp(opts.StagingDir, StagingPrefix+lease.SnapshotID()+"-")
	if err != nil {
		return res, fmt.Errorf("pause: staging: %w", err)
	}
	defer os.RemoveAll(dir)

	step(StepPause)
	frozen, resumed, err := freeze(ctx, inst, dir, req, step)
	if err != nil {
		return res, err
	}
	res.Timings.Freeze = frozen.took
	defer func() {
		if err == nil {
			return
		}
		// The VMM forgot these pages at the freeze: the next pause of
		// this restore must still find them.
		err = errors.Join(err, inst.KeepPending(frozen.Frozen))
		if !resumed {
			err = errors.Join(err, inst.Thaw(true))
		}
	}()
	res.Timings.Paused = time.Since(frozen.began)

	step(StepLayer)
	built, err := buildChild(dir, parent, res2, inst, frozen.Frozen, opts, step)
	if err != nil {
		return res, err
	}
	res.Timings.Layer = built.took
	res.Pages, res.Flattened = built.counts, built.merged

	step(StepPublish)
	tp := time.Now()
	child, err := repo.PublishLayer(ctx, lease, repository.LayerPublishRequest{
		Parent: parent, VMStatePath: frozen.VMStatePath, Layer: built.layer, Merged: built.merged, Alias: req.Alias,
		Manifest: built.manifest, Recording: built.recording,
	})
	if err != nil {
		return res, fmt.Errorf("pause: publish: %w", err)
	}
	res.Timings.Publish = time.Since(tp)
	res.Timings.Total = time.Since(t0)
	inst.Rebase(child.ID)
	if req.Stop {
		// The caller stops the VM; the pause is over.
		_ = inst.Thaw(false)
	}
	step(StepEnd)
	res.Child, res.Parent = child, parent.ID
	return res, nil
}

// checkParent re-reads the parent and refuses one the child cannot be
// built over, and an alias already bound, before anything changes: the
// publish would refuse the alias too, but only after the VM was paused.
func checkParent(ctx context.Context, repo Repository, id, alias string) (repository.Record, repository.Resolved, error) {
	res, err := repo.Resolve(ctx, id)
	if err != nil {
		return repository.Record{}, res, fmt.Errorf("pause: parent %s: %w", id, err)
	}
	if alias == "" {
		return res.Record, res, nil
	}
	// Only a binding found refuses: any other answer (none, a dangling or
	// quarantined binding) is the publish's to judge.
	if holder, err := repo.ResolveAlias(ctx, alias); err == nil {
		return repository.Record{}, res, fmt.Errorf("pause: %w", &repository.AliasConflictError{Alias: alias, HolderID: holder})
	}
	return res.Record, res, nil
}

// frozenVM is a Freeze's result with its timing.
type frozenVM struct {
	restore.Frozen
	began time.Time
	took  time.Duration
}

// freeze pauses the VM and saves its state and changed pages; unless
// req.Stop, it lets the VM run again at once (resumed). On error the VM
// runs again.
func freeze(ctx context.Context, inst *restore.Instance, dir string, req Request, step func(string)) (f frozenVM, resumed bool, err error) {
	f.began = time.Now()
	f.Frozen, err = inst.Freeze(ctx, dir)
	if err != nil {
		switch {
		case errors.Is(err, restore.ErrPauseInProgress), errors.Is(err, restore.ErrNotPausable):
		case errors.Is(err, restore.ErrVMExited):
			// No VM to resume; end the frozen window, if Freeze opened it.
			_ = inst.Thaw(false)
		default:
			err = errors.Join(err, inst.Thaw(true))
		}
		return f, false, fmt.Errorf("pause: %w", err)
	}
	f.took = time.Since(f.began)
	if req.Stop {
		return f, false, nil
	}
	step(StepResume)
	if err := inst.Thaw(true); err != nil {
		// The VMM forgot the frozen pages at the freeze and no child
		// will hold them: the next pause of this restore must.
		return f, true, fmt.Errorf("pause: resume: %w", errors.Join(err, inst.KeepPending(f.Frozen)))
	}
	return f, true, nil
}

// builtChild is what a child is published with: its layer (nil when
// nothing changed and the bound holds), whether that merges the parent's
// diff layers, and its harvested manifest.
type builtChild struct {
	layer     *layers.Built
	merged    bool
	counts    layers.Counts
	took      time.Duration // the layer step's
	manifest  []byte
	recording *repository.Recording
}

// buildChild builds the child's layer from the frozen pages, merging the
// parent's diff layers in when the child would pass the depth bound, then
// harvests its manifest.
func buildChild(dir string, parent repository.Record, res repository.Resolved, inst *restore.Instance, f restore.Frozen, opts Options, step func(string)) (b builtChild, err error) {
	t0 := time.Now()
	own, counts, err := buildLayer(dir, parent, res, f)
	if err != nil {
		return b, err
	}
	b.counts = counts
	if b.layer, b.merged, err = boundDepth(dir, parent, res, own, opts.maxDepth()); err != nil {
		return b, err
	}
	b.took = time.Since(t0)
	step(StepManifest)
	// The manifest's written pages are the guest's, not the merged ones.
	b.manifest, b.recording, err = harvestManifest(parent, inst, own, opts.extraPercent())
	if err != nil {
		return b, fmt.Errorf("pause: %w", err)
	}
	return b, nil
}
