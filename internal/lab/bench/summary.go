package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"warmstart/internal/config"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
)

// Cell is one condition's results.
type Cell struct {
	Condition Condition `json:"condition"`
	Sample    Sample    `json:"ready"`
	// DeviceMiB is the mean of device bytes read from acquisition to ready.
	DeviceMiB float64 `json:"-"`
	// MeanDeviceBytes is the same in bytes, as the JSON has it.
	MeanDeviceBytes float64 `json:"mean_device_bytes"`
	// Ratio is the mean over the same cache state's prefetch-off mean.
	Ratio float64 `json:"ratio_to_off,omitempty"`
	// StartupSet is the mean of the admitted trials' startup-set outcomes.
	StartupSet StartupSetMeans `json:"startup_set"`
	// Cost is the mean of the admitted trials' CPU and I/O until ready.
	Cost CostMeans `json:"cost"`
	// RatioToHot is the cell's time to ready over the hot control of the
	// same block, over the blocks that have both (blockTimes.ratios); nil
	// for the hot control itself, a run without one, or fewer than two
	// such blocks.
	RatioToHot *HotRatio `json:"ratio_to_hot,omitempty"`
}

// StartupSetMeans are the means, over a condition's admitted trials, of
// their timed restores' startup-set accounting (startupset.Report).
type StartupSetMeans struct {
	InTimePages float64 `json:"in_time_pages"`
	LatePages   float64 `json:"late_pages"`
	UnusedPages float64 `json:"unused_pages"`
	// MissedPages were requested outside the startup set; MissedPercent
	// is their share of the startup set's pages, in percent.
	MissedPages   float64 `json:"missed_pages"`
	MissedPercent float64 `json:"missed_percent"`
}

// meanStartupSet averages the trials' startup-set reports.
func meanStartupSet(reps []startupset.Report) StartupSetMeans {
	var m StartupSetMeans
	if len(reps) == 0 {
		return m
	}
	for _, r := range reps {
		m.InTimePages += float64(r.InTimePages)
		m.LatePages += float64(r.LatePages)
		m.UnusedPages += float64(r.UnusedPages)
		m.MissedPages += float64(r.MissedPages)
		if r.StartupSetPages > 0 {
			m.MissedPercent += 100 * float64(r.MissedPages) / float64(r.StartupSetPages)
		}
	}
	n := float64(len(reps))
	m.InTimePages, m.LatePages, m.UnusedPages = m.InTimePages/n, m.LatePages/n, m.UnusedPages/n
	m.MissedPages, m.MissedPercent = m.MissedPages/n, m.MissedPercent/n
	return m
}

// Pair is a paired comparison within blocks.
type Pair struct {
	Policy   string   `json:"policy,omitempty"`
	Label    string   `json:"label"`
	Interval Interval `json:"interval"`
}

// Summary is the run's result.
type Summary struct {
	Cells []Cell `json:"cells"`
	Pairs []Pair `json:"pairs"`
	// FasterEveryPair says, per policy, whether prefetch beat prefetch-off
	// in every block under both cache states.
	FasterEveryPair map[string]bool `json:"faster_every_pair"`
	MaxProbeGap     time.Duration   `json:"max_probe_gap_ns"`
	AllHashesOK     bool            `json:"all_hashes_ok"`
	Admitted        int             `json:"admitted"`
}

func summarize(o Options, trials []TrialResult) Summary {
	s := Summary{FasterEveryPair: map[string]bool{}, AllHashesOK: true}
	byBlock, mib, sets := s.tally(o.Blocks, trials)
	costs := costsOf(trials)
	for _, c := range o.Conditions() {
		cell := Cell{Condition: c, Sample: Summarize(byBlock.values(c)), DeviceMiB: Summarize(mib[c]).Mean, MeanDeviceBytes: Summarize(mib[c]).Mean * (1 << 20),
			StartupSet: meanStartupSet(sets[c]), Cost: meanCost(costs[c])}
		if off := Summarize(byBlock.values(Condition{c.Cache, PrefetchOff})); off.Mean > 0 && c.Cache != CacheHot {
			cell.Ratio = cell.Sample.Mean / off.Mean
		}
		if hot := (Condition{CacheHot, PrefetchOff}); c != hot {
			cell.RatioToHot = RatioOfBlocks(byBlock.ratios(c, hot))
		}
		s.Cells = append(s.Cells, cell)
	}
	off := func(cache string) Condition { return Condition{cache, PrefetchOff} }
	for _, p := range o.Policies {
		if !prefetches(p) {
			continue
		}
		on := func(cache string) Condition { return Condition{cache, p} }
		w := byBlock.diff(on(CacheWarm), off(CacheWarm))
		c := byBlock.diff(on(CacheCold), off(CacheCold))
		s.Pairs = append(s.Pairs,
			Pair{p, "file-warm: prefetch on minus off", w},
			Pair{p, "file-cold: prefetch on minus off", c},
			Pair{p, "prefetch on: file-cold minus file-warm", byBlock.diff(on(CacheCold), on(CacheWarm))})
		s.FasterEveryPair[p] = w.N == o.Blocks && c.N == o.Blocks && w.AllNegative && c.AllNegative
	}
	s.Pairs = append(s.Pairs, Pair{"", "prefetch off: file-cold minus file-warm", byBlock.diff(off(CacheCold), off(CacheWarm))})
	s.Pairs = append(s.Pairs, verificationPairs(o.Policies, byBlock.diff)...)
	s.Pairs = append(s.Pairs, learnedPairs(o.Policies, byBlock.diff)...)
	return s
}

// tally counts the admitted trials into s and returns their times by
// condition and block, and their device MiB and startup-set reports by
// condition.
func (s *Summary) tally(blocks int, trials []TrialResult) (blockTimes, map[Condition][]float64, map[Condition][]startupset.Report) {
	byBlock := blockTimes{blocks: blocks, ms: map[Condition]map[int]float64{}}
	mib := map[Condition][]float64{}
	sets := map[Condition][]startupset.Report{}
	for _, t := range trials {
		if !t.Admitted {
			continue
		}
		s.Admitted++
		s.AllHashesOK = s.AllHashesOK && t.HashOK
		s.MaxProbeGap = max(s.MaxProbeGap, t.ProbeGap)
		c := t.Spec.Condition
		if byBlock.ms[c] == nil {
			byBlock.ms[c] = map[int]float64{}
		}
		byBlock.ms[c][t.Spec.Block] = t.ReadyMs
		mib[c] = append(mib[c], float64(t.DeviceBytes.BytesRead)/(1<<20))
		sets[c] = append(sets[c], t.StartupSet)
	}
	return byBlock, mib, sets
}

// costsOf are the admitted trials' costs by condition.
func costsOf(trials []TrialResult) map[Condition][]restore.Cost {
	m := map[Condition][]restore.Cost{}
	for _, t := range trials {
		if t.Admitted {
			m[t.Spec.Condition] = append(m[t.Spec.Condition], t.Cost)
		}
	}
	return m
}

// blockTimes are admitted times to ready (ms) by condition and block.
type blockTimes struct {
	blocks int
	ms     map[Condition]map[int]float64
}

// values are c's times in block order.
func (b blockTimes) values(c Condition) []float64 {
	var xs []float64
	for blk := 0; blk < b.blocks; blk++ {
		if v, ok := b.ms[c][blk]; ok {
			xs = append(xs, v)
		}
	}
	return xs
}

// diff is the paired interval of a minus b over the blocks that have both.
func (b blockTimes) diff(x, y Condition) Interval {
	var d []float64
	for blk := 0; blk < b.blocks; blk++ {
		v, ok1 := b.ms[x][blk]
		w, ok2 := b.ms[y][blk]
		if ok1 && ok2 {
			d = append(d, v-w)
		}
	}
	return PairedInterval(d)
}

// ratios are x's times over y's, block by block, over the blocks that
// have both. A block's time is its admitted trial's (a replacement from a
// reserve block stands in the block of the trial it replaces: tally) and,
// with concurrent restores, the slowest restore's (TrialResult.ReadyMs).
func (b blockTimes) ratios(x, y Condition) []float64 {
	var r []float64
	for blk := 0; blk < b.blocks; blk++ {
		v, ok1 := b.ms[x][blk]
		w, ok2 := b.ms[y][blk]
		if ok1 && ok2 {
			r = append(r, v/w)
		}
	}
	return r
}

// WriteTable prints the summary as the seed reports it: one column per
// prefetch policy plus the prefetch-off baseline.
func (r *Report) WriteTable(w io.Writer) {
	o := r.Options
	drift := ""
	if o.Drift > 0 {
		drift = fmt.Sprintf(", drift %.2f (every trial plays its own variant of the trace)", o.Drift)
	}
	if o.Concurrency > 1 {
		drift += fmt.Sprintf(", %d concurrent restores per trial (time: the slowest)", o.Concurrency)
	}
	fmt.Fprintf(w, "snapshot %s, vmm %s, device %s, io_engine %d, %d blocks, seed %d%s, %d admitted trials, %s\n",
		o.Snapshot, o.VMM, o.Device, o.IOEngine, o.Blocks, o.Seed, drift, r.Summary.Admitted, r.Elapsed.Round(time.Second))
	r.writeSection(w, "time to ready, mean / median (ms)", func(c *Cell) string {
		return fmt.Sprintf("%.1f / %.1f", c.Sample.Mean, c.Sample.Median)
	})
	r.writeSection(w, "mean relative to prefetch off (reduction)", func(c *Cell) string {
		if c.Ratio == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx (%+.1f%%)", c.Ratio, (c.Ratio-1)*100)
	})
	if r.cell(CacheHot, PrefetchOff) != nil {
		r.writeSection(w, "over the same block's hot control: geometric mean ×/÷ 2 s.e. (blocks)", hotRatioCell)
	}
	r.writeSection(w, "device bytes read, acquisition to ready (MiB, mean)", func(c *Cell) string {
		return fmt.Sprintf("%.1f", c.DeviceMiB)
	})
	vmm := "VMM"
	if o.Concurrency > 1 {
		vmm = "VMMs summed"
	}
	r.writeSection(w, "CPU until ready: node (user+system) / "+vmm+" (ms, mean)", cpuCell)
	r.writeSection(w, "I/O until ready: node storage reads / bytes copied (MiB) / "+vmm+" major faults (mean)", ioCell)
	r.writeSection(w, "startup-set pages in time / late / unused by ready (mean)", func(c *Cell) string {
		m := c.StartupSet
		return fmt.Sprintf("%.0f / %.0f / %.0f", m.InTimePages, m.LatePages, m.UnusedPages)
	})
	r.writeSection(w, "pages missed: requested outside the startup set by ready (mean, % of the set)", func(c *Cell) string {
		return fmt.Sprintf("%.0f (%.1f%%)", c.StartupSet.MissedPages, c.StartupSet.MissedPercent)
	})
	writePairs(w, r.Summary.Pairs)
	writeLearning(w, r.Learning)
	fmt.Fprintln(w)
	r.writeVerdicts(w)
}

// hotRatioCell prints a cell's ratio to the hot control, "1.22x ×/÷ 1.06
// (8)", or why it has none.
func hotRatioCell(c *Cell) string {
	switch {
	case c.Condition == Condition{CacheHot, PrefetchOff}:
		return "control"
	case c.RatioToHot == nil:
		return "-"
	}
	h := c.RatioToHot
	return fmt.Sprintf("%.2fx ×/÷ %.2f (%d)", h.GeometricMean, h.Factor2SE, h.Blocks)
}

// cell is the summary's cell for (cache, policy), or nil.
func (r *Report) cell(cache, policy string) *Cell {
	for i := range r.Summary.Cells {
		if c := &r.Summary.Cells[i]; c.Condition.Cache == cache && c.Condition.Prefetch == policy {
			return c
		}
	}
	return nil
}

// writeSection prints one table: a row per cache state, a column per
// policy, f of each cell.
func (r *Report) writeSection(w io.Writer, title string, f func(c *Cell) string) {
	cols := append([]string{PrefetchOff}, r.Options.Policies...)
	caches := []string{CacheWarm, CacheCold}
	if r.cell(CacheHot, PrefetchOff) != nil {
		caches = append(caches, CacheHot)
	}
	fmt.Fprintf(w, "\n%s\n", title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "memory lower file\t")
	for _, p := range cols {
		fmt.Fprintf(tw, "%s\t", p)
	}
	fmt.Fprintln(tw)
	for _, cache := range caches {
		fmt.Fprintf(tw, "file-%s\t", cache)
		for _, p := range cols {
			if c := r.cell(cache, p); c != nil {
				fmt.Fprintf(tw, "%s\t", f(c))
			} else {
				fmt.Fprintf(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// writeVerdicts prints whether each policy won every pair, the checks of
// every trial, replacements and leaks.
func (r *Report) writeVerdicts(w io.Writer) {
	o := r.Options
	for _, p := range o.Policies {
		if !prefetches(p) {
			continue
		}
		verdict := "no"
		if r.Summary.FasterEveryPair[p] {
			verdict = "yes"
		}
		fmt.Fprintf(w, "%s: prefetch faster in every pair under both cache states: %s\n", p, verdict)
	}
	check := "guest-visible bytes correct in every trial"
	if o.VMM == config.DriverQEMU {
		check = "every guest answered with the snapshot's token and heap digest and left its lower file unchanged"
	}
	fmt.Fprintf(w, "max residency-probe-to-timer gap: %s; %s: %v\n", r.Summary.MaxProbeGap, check, r.Summary.AllHashesOK)
	for _, s := range r.Replaced {
		fmt.Fprintf(w, "replacement: %s\n", s)
	}
	if len(r.Leaks) == 0 {
		fmt.Fprintln(w, "after every trial: no VMM process, socket or mount left")
	}
	for _, l := range r.Leaks {
		fmt.Fprintf(w, "LEAK: %s\n", l)
	}
}

// writePairs prints the paired differences. A difference over fewer than
// two pairs has no Student-t interval (df = n-1 < 1) and is printed
// without one, rather than as an interval of zero width.
func writePairs(w io.Writer, pairs []Pair) {
	fmt.Fprintf(w, "\npaired differences within blocks, mean [descriptive 95%% Student-t interval, df = n-1]\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range pairs {
		name := p.Policy
		if name == "" {
			name = "-"
		}
		iv := p.Interval
		switch {
		case iv.N == 0:
			fmt.Fprintf(tw, "%s\t%s\t-\tn=0, no interval\n", name, p.Label)
		case iv.N < 2:
			fmt.Fprintf(tw, "%s\t%s\t%+.3f ms\tn=%d, no interval\n", name, p.Label, iv.Mean, iv.N)
		default:
			fmt.Fprintf(tw, "%s\t%s\t%+.3f ms\t[%+.3f, %+.3f] ms\tn=%d\n", name, p.Label, iv.Mean, iv.Low, iv.High, iv.N)
		}
	}
	tw.Flush()
}
