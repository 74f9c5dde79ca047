package refine

import (
	"cmp"
	"math"
	"slices"

	"warmstart/internal/manifest"
)

// DefaultAgeOut is how many restores in a row must leave a page untouched
// before it leaves: one restore that took another path is no reason to
// drop what the next may need again.
const DefaultAgeOut = 3

// Options tune Apply; the zero value means the defaults.
type Options struct {
	// AgeOut is the run of untouched restores after which a page leaves
	// (DefaultAgeOut when 0).
	AgeOut uint32
	// MaxPages bounds the state (0: twice the recorded manifest's pages,
	// at least minMaxPages, at most what one v1 manifest can hold). Past
	// it the stalest pages go first. Twice the base: a guest whose start
	// needs twice what was recorded has changed beyond drift, and every
	// page prefetched competes with the guest's own faults for the device.
	MaxPages int
	// Alpha is the share of the distance to its observed position a late
	// page moves per restore (0.5 when 0): ranks move toward what
	// restores observe without one odd restore deciding alone.
	Alpha float64
	// MaxStep bounds one restore's move of a page in ranks (0: an eighth
	// of the pages, at least 64).
	MaxStep float64
}

// minMaxPages keeps a tiny recorded manifest room to learn.
const minMaxPages = 1024

// maxManifestPages is how many pages one v1 manifest surely holds: every
// page its own range, with room for the largest layout header.
const maxManifestPages = (manifest.MaxEncodedBytes - 16<<10) / 16

func (o Options) withDefaults(s *State) Options {
	if o.AgeOut == 0 {
		o.AgeOut = DefaultAgeOut
	}
	if o.MaxPages <= 0 {
		o.MaxPages = int(min(max(2*s.BasePages, minMaxPages), maxManifestPages))
	}
	o.MaxPages = min(o.MaxPages, maxManifestPages)
	if o.Alpha <= 0 || o.Alpha > 1 {
		o.Alpha = 0.5
	}
	if o.MaxStep <= 0 {
		o.MaxStep = max(64, float64(len(s.Pages))/8)
	}
	return o
}

// Result says what one Apply changed.
type Result struct {
	// Late and Missed are the observation's demands in and outside the plan.
	Late, Missed int
	// Added pages entered; Moved pages changed rank toward the guest's
	// order; AgedOut left after Options.AgeOut untouched restores;
	// Evicted left to keep the state within Options.MaxPages.
	Added, Moved, AgedOut, Evicted int
}

// Apply learns from one restore. Missed pages enter at the rank where the
// guest needed them; late pages the guest needed before plan pages ranked
// ahead of them move toward those; pages observed untouched count a
// restore more toward aging out, pages needed start over. Then ranks are
// renumbered 0..n-1. Work is O(pages + demands) plus one sort of the
// pages. A restore whose guest asked for nothing outside the plan, in the
// plan's order, and left nothing untouched changes neither the pages nor
// their order, so the manifest (and its digest) stays.
func (s *State) Apply(obs Observation, opt Options) Result {
	opt = opt.withDefaults(s)
	var res Result
	res.Late, res.Missed = obs.Counts()
	at := make(map[int64]int, len(s.Pages))
	for i, p := range s.Pages {
		at[p.Page] = i
	}
	// Missed pages are placed by the ranks the restore prefetched in, not
	// by those moveLate is about to give.
	before := make([]float64, len(s.Pages))
	for i, p := range s.Pages {
		before[i] = p.Rank
	}
	res.Moved = s.moveLate(obs, at, opt)
	res.Added = s.addMissed(obs, at, before)
	s.markUse(obs, at)
	res.AgedOut = s.ageOut(opt.AgeOut)
	slices.SortStableFunc(s.Pages, byRank)
	res.Evicted = s.bound(opt.MaxPages)
	for i := range s.Pages {
		s.Pages[i].Rank = float64(i)
	}
	s.Restores++
	return res
}

// moveLate moves each late page toward the earliest-ranked plan page the
// guest demanded after it: the guest needed this page first, so it should
// come first. A guest demanding plan pages in rank order moves nothing,
// however slow prefetch was: moving every page forward would not make
// prefetch faster.
func (s *State) moveLate(obs Observation, at map[int64]int, opt Options) int {
	ranks := make([]float64, len(obs.Demands))
	for i, d := range obs.Demands {
		ranks[i] = math.Inf(1)
		if j, ok := at[d.Page]; ok && d.PlanIndex >= 0 {
			ranks[i] = s.Pages[j].Rank
		}
	}
	later := math.Inf(1)
	targets := make([]float64, len(ranks))
	for i := len(ranks) - 1; i >= 0; i-- {
		targets[i] = later
		later = min(later, ranks[i])
	}
	moved := 0
	for i, d := range obs.Demands {
		if math.IsInf(ranks[i], 1) || targets[i] >= ranks[i] {
			continue
		}
		s.Pages[at[d.Page]].Rank = ranks[i] - stepToward(ranks[i]-(targets[i]-0.5), opt)
		moved++
	}
	return moved
}

// stepToward is how far a page moves of the distance to its observed
// position: Alpha of it, at most MaxStep, and all of it once less than a
// rank would be left (ranks are renumbered after each Apply, so a page
// halving its distance forever would never pass its neighbour).
func stepToward(distance float64, opt Options) float64 {
	step := opt.Alpha * distance
	if distance-step < 1 {
		step = distance
	}
	return min(step, opt.MaxStep)
}

// addMissed ranks each missed page where the guest was when it needed it:
// just after the last plan page it had demanded, or just before the first
// plan page prefetch had not brought in yet, whichever is earlier, so that
// next time the page comes in before it is needed.
func (s *State) addMissed(obs Observation, at map[int64]int, before []float64) int {
	rankOf := func(page int64, otherwise float64) float64 {
		if j, ok := at[page]; ok && j < len(before) {
			return before[j]
		}
		return otherwise
	}
	rankOfPlan := func(i int) float64 {
		if i >= len(obs.Plan) {
			return float64(len(before))
		}
		return rankOf(obs.Plan[i], float64(i))
	}
	added := 0
	last := math.Inf(1)
	for _, d := range obs.Demands {
		if d.PlanIndex >= 0 {
			last = rankOf(d.Page, last)
			continue
		}
		pos := min(rankOfPlan(obs.frontierAt(d.At))-0.5, last+0.5)
		if j, ok := at[d.Page]; ok {
			// Learned already, from a restore of another plan.
			s.Pages[j].Rank = min(s.Pages[j].Rank, pos)
			continue
		}
		at[d.Page] = len(s.Pages)
		s.Pages = append(s.Pages, Page{Page: d.Page, Rank: pos})
		added++
	}
	return added
}

// markUse counts needed pages as seen and untouched ones toward aging out.
func (s *State) markUse(obs Observation, at map[int64]int) {
	used := func(p int64) {
		if j, ok := at[p]; ok {
			s.Pages[j].Seen = satAdd(s.Pages[j].Seen)
			s.Pages[j].Unused = 0
		}
	}
	for _, d := range obs.Demands {
		used(d.Page)
	}
	for _, p := range obs.Used {
		used(p)
	}
	for _, p := range obs.Untouched {
		if j, ok := at[p]; ok {
			s.Pages[j].Unused = satAdd(s.Pages[j].Unused)
		}
	}
}

func satAdd(n uint32) uint32 {
	if n == math.MaxUint32 {
		return n
	}
	return n + 1
}

// ageOut drops the pages untouched for ageOut restores in a row.
func (s *State) ageOut(ageOut uint32) int {
	n := len(s.Pages)
	s.Pages = slices.DeleteFunc(s.Pages, func(p Page) bool { return p.Unused >= ageOut })
	return n - len(s.Pages)
}

// bound evicts the stalest pages beyond maxPages: the longest untouched
// first, then the latest ranked (prefetched last, so needed least
// urgently). Seen does not decide: a page prefetched in time is needed
// without any device seeing it. s.Pages is in rank order and stays so.
func (s *State) bound(maxPages int) int {
	excess := len(s.Pages) - maxPages
	if excess <= 0 {
		return 0
	}
	order := make([]int, len(s.Pages))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		pa, pb := s.Pages[a], s.Pages[b]
		return cmp.Or(cmp.Compare(pb.Unused, pa.Unused), cmp.Compare(b, a))
	})
	gone := make(map[int64]bool, excess)
	for _, i := range order[:excess] {
		gone[s.Pages[i].Page] = true
	}
	s.Pages = slices.DeleteFunc(s.Pages, func(p Page) bool { return gone[p.Page] })
	return excess
}
