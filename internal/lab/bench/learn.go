package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"warmstart/internal/durable"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/refine"
	"warmstart/internal/restore"
)

// LearnedSuffix marks a column whose restores prefetch the manifest that
// learning restores refined from the recorded one ("warmstart+learned"),
// as a node's learner refines it from the restores it serves. Run beside
// the same policy without it, it measures what learning buys within one
// run, paired within blocks.
const LearnedSuffix = "+learned"

// DefaultLearn is the number of learning restores a learned column gets
// unless --learn says otherwise.
const DefaultLearn = 3

// MaxLearn bounds the learning restores of one column.
const MaxLearn = 32

// maxLearnAttempts bounds the tries of one learning restore: a restore
// that missed its cold-cache admission taught nothing and is run again.
const maxLearnAttempts = 3

// cutLearned strips LearnedSuffix from a column name, wherever it is
// among the suffixes.
func cutLearned(name string) (string, bool) {
	if !strings.Contains(name, LearnedSuffix) {
		return name, false
	}
	return strings.Replace(name, LearnedSuffix, "", 1), true
}

// learned reports whether a column prefetches a learned manifest.
func learned(column string) bool {
	_, ok := cutLearned(column)
	return ok
}

// LearnReport is what the learning restores of one column did.
type LearnReport struct {
	Column string `json:"column"`
	// Restores are the learning restores, in order.
	Restores []LearnStep `json:"restores"`
	// BasePages and Pages are the recorded manifest's and the learned
	// one's page counts; Digest is the learned manifest's SHA-256.
	BasePages int64  `json:"base_pages"`
	Pages     int    `json:"pages"`
	Digest    string `json:"digest"`
}

// LearnStep is one learning restore: what it needed outside the plan it
// prefetched and how the state changed.
type LearnStep struct {
	Variant int     `json:"variant"`
	ReadyMs float64 `json:"ready_ms"`
	refine.Result
}

// learns reports whether a run has a learned column.
func (o Options) learns() bool {
	return slices.ContainsFunc(o.Policies, learned)
}

// LearnVariants is how many drifting variants the learning restores play
// beyond VariantCount: one per learning restore, shared by every learned
// column so that each learns from the same start-ups.
func (o Options) LearnVariants() int {
	if o.Drift == 0 || !o.learns() {
		return 0
	}
	return o.Learn
}

// validateLearn checks the learning restores of a run with learned columns.
func (o Options) validateLearn() error {
	if o.Learn < 0 || o.Learn > MaxLearn || (o.learns() && o.Learn < 1) {
		return fmt.Errorf("bench: --learn %d: want 1 to %d learning restores for a %s column", o.Learn, MaxLearn, LearnedSuffix)
	}
	return nil
}

// LearnTrace is the trace the i-th learning restore plays: the base
// without drift, else a variant numbered above every trial's
// (VariantCount), so a learning restore never rehearses a timed one.
func (o Options) LearnTrace(i int) (string, int) {
	k := o.VariantCount() + i + 1
	if o.Drift == 0 || k > len(o.Variants) {
		return o.TracePath, 0
	}
	return o.Variants[k-1], k
}

// learnColumns runs the learning restores of every learned column and
// keeps each column's learned source for its trials.
func (b *runner) learnColumns(ctx context.Context) error {
	for _, col := range b.o.Policies {
		if !learned(col) {
			continue
		}
		src, rep, err := b.learnColumn(ctx, col)
		if err != nil {
			return err
		}
		b.sources[col] = src
		b.rep.Learning = append(b.rep.Learning, rep)
	}
	return nil
}

// learnColumn starts from the recorded manifest and, o.Learn times,
// restores (file-cold, the column's policy) prefetching the manifest
// learned so far and applies what that restore observed.
func (b *runner) learnColumn(ctx context.Context, col string) (restore.Source, LearnReport, error) {
	o := b.o
	state, err := initialState(o.Source)
	if err != nil {
		return restore.Source{}, LearnReport{}, fmt.Errorf("bench: learn %s: %w", col, err)
	}
	rep := LearnReport{Column: col, BasePages: state.BasePages}
	src, err := b.learnedSource(col, state, 0)
	for i := 0; err == nil && i < o.Learn; i++ {
		var step LearnStep
		if step, err = b.learnOnce(ctx, col, src, i, &state); err == nil {
			rep.Restores = append(rep.Restores, step)
			fmt.Fprintf(o.Progress, "learning restore %d/%d %s: %.1f ms, %d late, %d missed; %d added, %d moved, %d aged out → %d pages\n",
				i+1, o.Learn, col, step.ReadyMs, step.Late, step.Missed, step.Added, step.Moved, step.AgedOut, len(state.Pages))
			src, err = b.learnedSource(col, state, i+1)
		}
	}
	if err != nil {
		return restore.Source{}, rep, fmt.Errorf("bench: learn %s: %w", col, err)
	}
	rep.Pages, rep.Digest = len(state.Pages), src.Manifest.SHA256
	return src, rep, nil
}

// learnOnce runs the i-th learning restore of col on src and applies its
// observation to state.
func (b *runner) learnOnce(ctx context.Context, col string, src restore.Source, i int, state *refine.State) (LearnStep, error) {
	path, variant := b.o.LearnTrace(i)
	want, err := b.expectedHash(path)
	if err != nil {
		return LearnStep{}, err
	}
	spec := TrialSpec{Block: -1, Condition: Condition{CacheCold, col}, Device: b.o.Device, IOEngine: b.o.IOEngine,
		Source: src, MemoryPath: memdev.FilePath(src.Memory), VMM: b.o.VMM, QEMU: b.o.QEMU, TracePath: path, Variant: variant, ExpectedSHA256: want,
		ExpectedToken: b.o.ExpectedToken, ExpectedDigest: b.o.ExpectedDigest, Readaround: b.o.Readaround}
	for range maxLearnAttempts {
		res, err := b.launch.run(ctx, spec)
		switch {
		case err != nil:
			return LearnStep{}, err
		case res.Err != "":
			return LearnStep{}, fmt.Errorf("learning restore %d: %s", i+1, res.Err)
		case !res.Admitted:
			continue
		case res.Observation == nil:
			return LearnStep{}, fmt.Errorf("learning restore %d: the restore did not prefetch (%s)", i+1, res.Prefetch.Reason)
		}
		return LearnStep{Variant: variant, ReadyMs: res.ReadyMs, Result: state.Apply(*res.Observation, refine.Options{})}, nil
	}
	return LearnStep{}, fmt.Errorf("learning restore %d: missed its cold-cache admission %d times", i+1, maxLearnAttempts)
}

// initialState is the learning state of the source's recorded manifest.
func initialState(src restore.Source) (refine.State, error) {
	if src.Manifest == nil {
		return refine.State{}, errors.New("the snapshot has no startup manifest to learn from")
	}
	data, err := manifest.ReadFile(src.ManifestPath)
	if err != nil {
		return refine.State{}, err
	}
	m, err := manifest.Verify(data, *src.Manifest, src.Layout)
	if err != nil {
		return refine.State{}, err
	}
	return refine.Initial(m, src.Manifest.SHA256), nil
}

// learnedSource is o.Source with state's manifest as its startup
// manifest, written to the work directory (step n of col).
func (b *runner) learnedSource(col string, state refine.State, n int) (restore.Source, error) {
	src := b.o.Source
	_, data, err := state.Manifest(src.Layout)
	if err != nil {
		return src, err
	}
	dir := filepath.Join(b.o.WorkDir, "learned")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return src, err
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-%d.manifest", strings.ReplaceAll(col, "+", "_"), n))
	if err := durable.WriteBytes(path, 0o600, data); err != nil {
		return src, err
	}
	d := manifest.Describe(data)
	src.ManifestPath, src.Manifest = path, &d
	// The learned manifest is the one to prefetch, whatever the record
	// had learned before.
	src.Refinement, src.RefinementPath = nil, ""
	return src, nil
}

// writeLearning says, per learned column, what its learning restores
// missed one after another and how the manifest changed.
func writeLearning(w io.Writer, reps []LearnReport) {
	for _, rep := range reps {
		missed := make([]string, len(rep.Restores))
		for i, s := range rep.Restores {
			missed[i] = strconv.Itoa(s.Missed)
		}
		fmt.Fprintf(w, "learned %s: %d learning restores missed %s pages in turn; manifest %d -> %d pages (%.12s)\n",
			rep.Column, len(rep.Restores), strings.Join(missed, ", "), rep.BasePages, rep.Pages, rep.Digest)
	}
}

// learnRestores is the learning restores per learned column, 0
// for a run without one (what the report records).
func (o Options) learnRestores() int {
	if !o.learns() {
		return 0
	}
	return o.Learn
}
