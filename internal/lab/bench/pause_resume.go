package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/lab/pagecache"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
)

// admitAttempts bounds the restores a timed resume makes until the
// residency probe admits one (another process read or evicted a lower
// file in between).
const admitAttempts = 3

// ResumeReport is the last child's resume measured: its cold restore
// against its hot control and file-warm, against a flattened copy, and
// with its harvested manifest against one recorded by a throwaway resume.
type ResumeReport struct {
	Child     string `json:"child"`
	Depth     int    `json:"depth"`
	FlatDepth int    `json:"flattened_depth"`
	Policy    string `json:"policy"`
	// Trials are the timed restores, one of each kind per trial.
	Trials []ResumeTrial `json:"trials"`
	// Rejected counts restores the residency probe did not admit, made
	// again.
	Rejected  int           `json:"rejected"`
	Harvested ManifestFacts `json:"harvested"`
	Recorded  ManifestFacts `json:"recorded"`
	// CommonPages and Jaccard compare the two manifests' pages.
	CommonPages int64   `json:"common_pages"`
	Jaccard     float64 `json:"jaccard"`
}

// ResumeTrial is one trial: each kind of restore to ready, in a rotated
// order, every one prefetching with the child's harvested manifest except
// Recorded.
type ResumeTrial struct {
	Cold     time.Duration `json:"cold_ns"`
	Hot      time.Duration `json:"hot_ns"`
	Warm     time.Duration `json:"warm_ns"`
	Flat     time.Duration `json:"flattened_cold_ns"`
	Recorded time.Duration `json:"recorded_cold_ns"`
}

// ManifestFacts are one manifest's size.
type ManifestFacts struct {
	Pages  int64 `json:"pages"`
	Bytes  int64 `json:"bytes"`
	Ranges int   `json:"ranges"`
}

// resumeSource is a snapshot a trial restores and the lower files its
// memory device reads (every layer of its chain).
type resumeSource struct {
	name    string
	src     restore.Source
	lowers  []string
	checked bool // its guest's state was read back once
}

// resumeBench is the trials in progress.
type resumeBench struct {
	r       *restore.Restorer
	policy  restore.Policy
	want    map[string]string
	sources struct{ chain, flat, recorded resumeSource }
	rep     *ResumeReport
	// onChecked is called when the chain's guest first reports its state.
	onChecked func()
}

// resume measures the last child's resume (the run's ResumeTrials).
func (p *pauseRun) resume(ctx context.Context, id string) (*ResumeReport, error) {
	name := config.Default().Prefetch.Policy
	policy, err := restore.LookupPolicy(name)
	if err != nil {
		return nil, err
	}
	b := &resumeBench{r: p.n.Restorer, policy: policy, want: wantState(p.o.Cycles, p.writeKiB()),
		rep: &ResumeReport{Child: id, Policy: name}, onChecked: func() { p.rep.CyclesCorrect++ }}
	if err := p.sources(ctx, b, id); err != nil {
		return nil, err
	}
	for t := range p.o.ResumeTrials {
		tr, err := b.trial(ctx, t)
		if err != nil {
			return b.rep, fmt.Errorf("trial %d: %w", t, err)
		}
		fmt.Fprintf(p.o.Progress, "resume trial %d: cold %v, hot %v, warm %v, flattened %v, recorded %v\n", t,
			tr.Cold.Round(time.Millisecond), tr.Hot.Round(time.Millisecond), tr.Warm.Round(time.Millisecond),
			tr.Flat.Round(time.Millisecond), tr.Recorded.Round(time.Millisecond))
		b.rep.Trials = append(b.rep.Trials, tr)
	}
	return b.rep, nil
}

// sources resolves the child, copies and flattens it, and records its
// manifest with a throwaway resume.
func (p *pauseRun) sources(ctx context.Context, b *resumeBench, id string) error {
	res, err := p.store.Resolve(ctx, id)
	if err != nil {
		return err
	}
	b.rep.Depth = res.Record.Depth()
	if b.sources.chain, err = sourceOf("chain", res); err != nil {
		return err
	}
	flat, err := flattenedCopy(ctx, p.store.Root(), p.o.WorkDir, id)
	if err != nil {
		return err
	}
	b.rep.FlatDepth = flat.Record.Depth()
	if b.sources.flat, err = sourceOf("flattened", flat); err != nil {
		return err
	}
	b.sources.recorded, err = p.recordedSource(ctx, b.sources.chain, b.rep)
	return err
}

// sourceOf is a resolved snapshot as a trial restores it.
func sourceOf(name string, res repository.Resolved) (resumeSource, error) {
	s := resumeSource{name: name, src: restore.SourceOf(res)}
	if res.MemoryPath != "" {
		s.lowers = []string{res.MemoryPath}
		return s, nil
	}
	chain, ok := res.Memory.(*repository.ChainSource)
	if !ok {
		return s, fmt.Errorf("snapshot %s: memory %T is neither a local file nor a chain", res.Record.ID, res.Memory)
	}
	for i, l := range chain.Layers() {
		if l.DataPath == "" {
			return s, fmt.Errorf("snapshot %s: layer %d is not a local file", res.Record.ID, i)
		}
		s.lowers = append(s.lowers, l.DataPath)
	}
	return s, nil
}

// trial times each kind once, starting with a different kind each trial
// so that no kind always follows the same one.
func (b *resumeBench) trial(ctx context.Context, t int) (ResumeTrial, error) {
	var tr ResumeTrial
	s := &b.sources
	kinds := []struct {
		src   *resumeSource
		cache string
		out   *time.Duration
	}{
		{&s.chain, CacheCold, &tr.Cold}, {&s.chain, CacheHot, &tr.Hot}, {&s.flat, CacheCold, &tr.Flat},
		{&s.chain, CacheWarm, &tr.Warm}, {&s.recorded, CacheCold, &tr.Recorded},
	}
	for k := range kinds {
		kind := kinds[(k+t)%len(kinds)]
		d, err := b.timed(ctx, kind.src, kind.cache, fmt.Sprintf("resume-%d-%d", t, k))
		if err != nil {
			return tr, fmt.Errorf("%s file-%s: %w", kind.src.name, kind.cache, err)
		}
		*kind.out = d
	}
	return tr, nil
}

// timed is one admitted restore of s to ready in the cache state.
func (b *resumeBench) timed(ctx context.Context, s *resumeSource, cache, key string) (time.Duration, error) {
	for attempt := range admitAttempts {
		d, admitted, err := b.once(ctx, s, cache, fmt.Sprintf("%s-%d", key, attempt))
		if err != nil || admitted {
			return d, err
		}
		b.rep.Rejected++
	}
	return 0, fmt.Errorf("the residency probe admitted none of %d restores", admitAttempts)
}

// once treats the lower files' cache, probes them and, when admitted,
// restores s with prefetch on a device of its own (key); the hot control
// first starts a warm instance on that device, held still while the
// timed restore shares its cached pages.
func (b *resumeBench) once(ctx context.Context, s *resumeSource, cache, key string) (time.Duration, bool, error) {
	stopCtx := context.WithoutCancel(ctx)
	if err := treatLowers(s.lowers, cache); err != nil {
		return 0, false, err
	}
	if cache == CacheHot {
		hot, err := holdWarm(ctx, b.r, s.src, restore.Options{Prefetch: restore.ModeOff, DeviceKey: key})
		if err != nil {
			return 0, false, fmt.Errorf("hot control warm-up: %w", err)
		}
		defer hot.Stop(stopCtx)
	}
	if ok, err := admitLowers(s.lowers, cache); err != nil || !ok {
		return 0, false, err
	}
	inst, err := b.r.Restore(ctx, s.src, restore.Options{Prefetch: restore.ModeOn, Policy: b.policy, DeviceKey: key})
	if err != nil {
		return 0, true, err
	}
	d := inst.Timings.Ready
	err = b.check(ctx, s, inst)
	return d, true, errors.Join(err, inst.Stop(stopCtx))
}

// check makes sure the timed restore prefetched its manifest and, once
// per source, that its guest holds the last cycle's state.
func (b *resumeBench) check(ctx context.Context, s *resumeSource, inst *restore.Instance) error {
	if inst.Prefetch.PlannedBytes == 0 {
		return fmt.Errorf("the restore prefetched nothing: %s", inst.Prefetch.Reason)
	}
	if s.checked {
		return nil
	}
	if err := checkState(ctx, inst, b.want); err != nil {
		return fmt.Errorf("restore of %s: %w", s.name, err)
	}
	s.checked = true
	if s == &b.sources.chain && b.onChecked != nil {
		b.onChecked()
	}
	return nil
}

// treatLowers drops every lower file from the page cache (cold) or reads
// each in full (warm, hot).
func treatLowers(paths []string, cache string) error {
	for _, path := range paths {
		var err error
		if cache == CacheCold {
			err = evictSynced(path)
		} else {
			err = readAll(path)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// admitLowers probes every lower file's residency: none resident for
// file-cold, all for file-warm and the hot control (admitted).
func admitLowers(paths []string, cache string) (bool, error) {
	for _, path := range paths {
		r, err := pagecache.Probe(path)
		if err != nil {
			return false, err
		}
		if !admitted(cache, r) {
			return false, nil
		}
	}
	return true, nil
}

// readAll reads path to its end, leaving it resident.
func readAll(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("warm %s: %w", path, err)
	}
	defer f.Close()
	if _, err := io.Copy(io.Discard, f); err != nil {
		return fmt.Errorf("warm %s: %w", path, err)
	}
	return nil
}

// evictSynced writes back path's dirty pages, which an eviction leaves in
// the cache (the flattened copy's files were just written), then evicts
// it.
func evictSynced(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("evict %s: %w", path, err)
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return fmt.Errorf("evict %s: write back: %w", path, err)
	}
	return pagecache.Evict(path)
}
