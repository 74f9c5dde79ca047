package synth

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"time"

	"warmstart/internal/durable"
	"warmstart/internal/trace"
)

// A drifting workload: start-up traces that differ from the base trace the
// way one guest's start-ups differ from each other.
//
// A real guest does not start up the same way twice, but it does not start
// up at random either: timers, random seeds, the first request's payload and
// the host's load choose among a finite set of alternative paths through the
// same code and data. So a variant is not the base with random pages swapped
// for random pages, which no learner could ever predict; it is built from
// two pools drawn once per snapshot seed:
//
//   - droppable runs: runs of the base's touched pages a start-up may skip
//     (a branch not taken, a file already cached by another path);
//   - optional runs: runs of pages the base did not touch, placed in the
//     same regions as the model's touched memory and cut into runs of the
//     region's run length (more kernel text along another path, another
//     part of a file, other heap objects), topped up with runs of free
//     memory (fresh allocations) only when the regions hold too few.
//
// Each pool holds about twice what one variant needs, so a variant takes
// each pool run with probability about 1/2: a page one variant adds recurs
// in about half the others, and a manifest that learns from restores can
// catch up. Most added runs take the place, in touch order, of a dropped
// run of the same region (the alternative path runs where the skipped one
// would have); the rest are touched right after a random touch of their
// region. Last, the order is perturbed locally: with probability F each
// touch swaps places with one of the next orderWindow.
//
// A variant drops exactly round(F·N) of the base's N touched pages and adds
// as many, so trace.Compare measures a drift of F (half the symmetric
// difference over the base's pages). With F = 0 a variant is the base.
// Dropped touches' compute time is carried to the next touch, so the
// guest's compute timeline (pauses included) stays the base's.

// Variant file names beside the base trace and the bounds synth accepts.
const (
	variantFileFormat = "startup.variant-%03d.trace"
	// MaxVariants bounds --variants: every variant is a trace file of
	// about the base's size.
	MaxVariants = 999
)

// Drift model parameters.
const (
	// poolOverTarget is how many times a variant's need each pool holds:
	// 2 makes every pool run's chance to be taken about 1/2.
	poolOverTarget = 2
	// replacedShare is the share of added runs that take the touch-order
	// place of a dropped run of their region.
	replacedShare = 0.8
	// orderWindow is how far, in ranks, a perturbed touch moves.
	orderWindow = 8
	// freeRunPages and freeWriteShare shape the runs drawn from free
	// memory: fresh heap-like allocations.
	freeRunPages   = 8
	freeWriteShare = 0.3
)

// Salts of the drift's random streams: the pools (per seed) and each
// variant (per seed and variant number).
const (
	poolSalt    = 0x706f6f6c
	variantSalt = 0x76617269616e74
)

// run is a run of consecutive pages of one region (or of free memory).
type run struct {
	region int8
	pages  []int
}

// Drift makes the variants of a model's trace for one drift fraction.
type Drift struct {
	m        *Model
	fraction float64
	// target is how many pages a variant drops and how many it adds.
	target    int
	droppable []run
	optional  []run
	// rank is each page's first-touch index in the base trace (-1 when
	// untouched); regionRanks lists, per region, the base ranks of its
	// pages.
	rank        []int32
	regionRanks [][]int
}

// CheckDrift refuses a drift fraction outside [0, 1].
func CheckDrift(fraction float64) error {
	if math.IsNaN(fraction) || fraction < 0 || fraction > 1 {
		return fmt.Errorf("drift %v: want a fraction of touched pages from 0 to 1", fraction)
	}
	return nil
}

// NewDrift draws the model's pools for variants that differ from its
// trace by fraction of its touched pages.
func NewDrift(m *Model, fraction float64) (*Drift, error) {
	if err := CheckDrift(fraction); err != nil {
		return nil, err
	}
	d := &Drift{m: m, fraction: fraction, rank: make([]int32, m.Pages()), regionRanks: make([][]int, len(regions))}
	for i := range d.rank {
		d.rank[i] = -1
	}
	touched := 0
	for i, e := range m.Trace {
		p := int(e.Offset / trace.PageBytes)
		if d.rank[p] < 0 {
			d.rank[p] = int32(i)
			touched++
			if reg := m.region[p]; reg != freeRegion {
				d.regionRanks[reg] = append(d.regionRanks[reg], i)
			}
		}
	}
	d.target = int(math.Round(fraction * float64(touched)))
	want := poolOverTarget * d.target
	// One stream, drawn in the same order whatever the fraction, so the
	// pools of a larger drift hold those of a smaller one.
	r := rand.New(rand.NewPCG(m.seed, poolSalt))
	base := d.runsOf(r, func(p int) bool { return d.rank[p] >= 0 })
	spare := d.runsOf(r, func(p int) bool { return d.rank[p] < 0 && m.region[p] != freeRegion })
	d.droppable = prefix(base, want)
	d.optional = prefix(spare, want)
	if n := pagesIn(d.optional); n < want {
		// Drawn last, and only when needed: free memory is most of a
		// large guest.
		free := d.runsOf(r, func(p int) bool { return d.rank[p] < 0 && m.region[p] == freeRegion })
		d.optional = append(d.optional, prefix(free, want-n)...)
	}
	return d, nil
}

// runsOf cuts the pages that satisfy in into runs: maximal stretches of
// one region, each cut into lengths drawn like the region's touched runs.
// It returns them shuffled.
func (d *Drift) runsOf(r *rand.Rand, in func(p int) bool) []run {
	var runs []run
	n := d.m.Pages()
	for p := 0; p < n; {
		if !in(p) {
			p++
			continue
		}
		reg := d.m.region[p]
		end := p
		for end < n && in(end) && d.m.region[end] == reg {
			end++
		}
		for p < end {
			k := min(geometric(r, runMean(reg)), end-p)
			pages := make([]int, k)
			for j := range pages {
				pages[j] = p + j
			}
			runs = append(runs, run{region: reg, pages: pages})
			p += k
		}
	}
	r.Shuffle(len(runs), func(i, j int) { runs[i], runs[j] = runs[j], runs[i] })
	return runs
}

func runMean(reg int8) float64 {
	if reg == freeRegion {
		return freeRunPages
	}
	return regions[reg].runPages
}

func writeShare(reg int8) float64 {
	if reg == freeRegion {
		return freeWriteShare
	}
	return regions[reg].writ
}

// prefix is the shortest prefix of runs holding at least pages pages.
func prefix(runs []run, pages int) []run {
	got := 0
	for i, rn := range runs {
		if got >= pages {
			return runs[:i]
		}
		got += len(rn.pages)
	}
	return runs
}

func pagesIn(runs []run) int {
	n := 0
	for _, rn := range runs {
		n += len(rn.pages)
	}
	return n
}

// choose takes runs of pool, each with the same probability, until it
// holds exactly target pages (the last run cut short), or the whole pool
// when it holds fewer. The probability is target over the pool's pages,
// about 1/2, so which runs a variant takes varies from variant to variant.
func choose(r *rand.Rand, pool []run, target int) []run {
	total := pagesIn(pool)
	if target <= 0 || total == 0 {
		return nil
	}
	p := math.Min(1, float64(target)/float64(total))
	taken := make([]bool, len(pool))
	order := r.Perm(len(pool))
	var out []run
	got, left := 0, len(pool)
	for got < target && left > 0 {
		for _, i := range order {
			if taken[i] || r.Float64() >= p {
				continue
			}
			taken[i], left = true, left-1
			rn := pool[i]
			rn.pages = rn.pages[:min(len(rn.pages), target-got)]
			out = append(out, rn)
			if got += len(rn.pages); got == target {
				break
			}
		}
	}
	return out
}

// Variant returns variant k (k >= 1) of the model's trace: deterministic
// for the model's seed, the drift fraction and k.
func (d *Drift) Variant(k int) []trace.Entry {
	base := d.m.Trace
	if d.fraction == 0 {
		return append([]trace.Entry(nil), base...)
	}
	r := rand.New(rand.NewPCG(d.m.seed^variantSalt, uint64(k)))
	dropped := choose(r, d.droppable, d.target)
	added := choose(r, d.optional, d.target)
	out := d.splice(r, dropped, added)
	perturb(r, out, d.fraction)
	return out
}

// splice plays the base trace without the dropped pages and with the
// added runs inserted where they belong (see anchors).
func (d *Drift) splice(r *rand.Rand, dropped, added []run) []trace.Entry {
	base := d.m.Trace
	skip := make(map[int64]bool, d.target)
	for _, rn := range dropped {
		for _, p := range rn.pages {
			skip[int64(p)*trace.PageBytes] = true
		}
	}
	at := d.anchors(r, dropped, added)
	out := make([]trace.Entry, 0, len(base)+d.target)
	var carry time.Duration
	emit := func(e trace.Entry) {
		e.Compute += carry
		carry = 0
		out = append(out, e)
	}
	for i := 0; i <= len(base); i++ {
		for _, rn := range at[i] {
			for j, p := range rn.pages {
				mean := burstComputeMean
				if j == 0 {
					mean = switchComputeMean
				}
				emit(trace.Entry{Offset: int64(p) * trace.PageBytes, Write: r.Float64() < writeShare(rn.region),
					Compute: time.Duration(r.ExpFloat64() * float64(mean))})
			}
		}
		if i == len(base) {
			break
		}
		if skip[base[i].Offset] {
			carry += base[i].Compute
			continue
		}
		emit(base[i])
	}
	return out
}

// anchors places each added run before a base index: a dropped run's first
// touch of the same region (replacedShare of them, while such places
// last), else just after a random touch of its region, else anywhere.
func (d *Drift) anchors(r *rand.Rand, dropped, added []run) map[int][]run {
	places := make(map[int8][]int)
	for _, rn := range dropped {
		first := len(d.m.Trace)
		for _, p := range rn.pages {
			first = min(first, int(d.rank[p]))
		}
		places[rn.region] = append(places[rn.region], first)
	}
	at := make(map[int][]run, len(added))
	for _, rn := range added {
		var i int
		switch free := places[rn.region]; {
		case len(free) > 0 && r.Float64() < replacedShare:
			i, places[rn.region] = free[0], free[1:]
		case rn.region != freeRegion && len(d.regionRanks[rn.region]) > 0:
			ranks := d.regionRanks[rn.region]
			i = ranks[r.IntN(len(ranks))] + 1
		default:
			i = r.IntN(len(d.m.Trace) + 1)
		}
		at[i] = append(at[i], rn)
	}
	return at
}

// perturb moves touches locally: with probability fraction each touch
// swaps its page with one of the next orderWindow touches, keeping the
// compute time at its rank.
func perturb(r *rand.Rand, entries []trace.Entry, fraction float64) {
	for i := range entries {
		if r.Float64() >= fraction {
			continue
		}
		j := i + 1 + r.IntN(orderWindow)
		if j >= len(entries) {
			continue
		}
		a, b := &entries[i], &entries[j]
		a.Offset, b.Offset = b.Offset, a.Offset
		a.Write, b.Write = b.Write, a.Write
	}
}

// VariantPath is the file of variant k (from 1) beside the base trace in dir.
func VariantPath(dir string, k int) string {
	return filepath.Join(dir, fmt.Sprintf(variantFileFormat, k))
}

// CheckVariants refuses a variant count and drift no run can use: drift
// must be a fraction in [0, 1], and variants (at most MaxVariants) and a
// drift above 0 go together (at drift 0 every variant is the base).
func CheckVariants(count int, fraction float64) error {
	if err := CheckDrift(fraction); err != nil {
		return err
	}
	switch {
	case count < 0 || count > MaxVariants:
		return fmt.Errorf("%d variants: want 0 to %d", count, MaxVariants)
	case count > 0 && fraction == 0:
		return fmt.Errorf("%d variants with drift 0 would all be the base trace: give a drift above 0", count)
	case count == 0 && fraction > 0:
		return fmt.Errorf("drift %v without variants: give how many variants to write", fraction)
	}
	return nil
}

// VariantOptions say which variants of a reference snapshot's trace to write.
type VariantOptions struct {
	// MemoryBytes and Seed name the reference snapshot (0: DefaultMemoryBytes).
	MemoryBytes int64
	Seed        uint64
	// Dir receives the variants, beside the base trace.
	Dir string
	// Count variants, numbered 1 to Count, at drift Fraction.
	Count    int
	Fraction float64
	// Progress, when set, receives a summary line.
	Progress io.Writer
}

// WriteVariants writes variants 1 to o.Count of the reference snapshot's
// trace into o.Dir, each durably (temporary file, fsync, rename, then the
// directory synced once), and returns their paths.
func WriteVariants(o VariantOptions) ([]string, error) {
	if o.MemoryBytes == 0 {
		o.MemoryBytes = DefaultMemoryBytes
	}
	m, err := NewModel(o.MemoryBytes, o.Seed)
	if err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	return writeVariants(m, o)
}

func writeVariants(m *Model, o VariantOptions) ([]string, error) {
	if err := CheckVariants(o.Count, o.Fraction); err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	d, err := NewDrift(m, o.Fraction)
	if err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	var paths []string
	var first trace.Difference
	for k := 1; k <= o.Count; k++ {
		entries := d.Variant(k)
		path := VariantPath(o.Dir, k)
		if err := writeFile(path, func(w io.Writer) error { return trace.Write(w, entries) }); err != nil {
			return paths, fmt.Errorf("synth: write %s: %w", path, err)
		}
		if k == 1 {
			first = trace.Compare(m.Trace, entries)
		}
		paths = append(paths, path)
	}
	if err := durable.Sync(o.Dir); err != nil {
		return paths, fmt.Errorf("synth: %w", err)
	}
	if o.Progress != nil && o.Count > 0 {
		fmt.Fprintf(o.Progress, "synth: %d variants of %s at drift %.2f: each drops %d of its %d pages and adds %d (variant 1: %.3f of pages differ, rank correlation %.4f)\n",
			o.Count, TraceFile, o.Fraction, first.Dropped, first.BasePages, first.Added, first.Fraction, first.RankCorrelation)
	}
	return paths, nil
}
