package s3

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"warmstart/internal/refine"
	"warmstart/internal/repository"
)

// TestLearningUploadsBounded learns, as a node's learner does (refine's
// Apply, one refinement attached per restore), from 24 restores of a guest
// whose start-up drifts by 20 % every time (a tenth of the recorded pages
// dropped, as many added elsewhere, new ones each restore): the refined
// packs uploaded stay within one per refinedPackMinRestores attaches (plus
// the first), and a cold node's prefetch before ready fetches the pack it
// streams and nothing else. It logs the bytes uploaded per attach (the
// README's figures).
func TestLearningUploadsBounded(t *testing.T) {
	const restores, drift = 24, 0.2
	publisher := openRepo(t)
	ls := publishLearned(t, publisher, 1024, 0, 0)
	state := refine.Initial(ls.recorded, sha256Hex(ls.recordedData))
	plan := refinedPages(ls.recorded)
	var packs []*repository.StartupPackDescriptor
	var uploaded, refinementBytes int64
	for i := 1; i <= restores; i++ {
		variant := driftedPages(refinedPages(ls.recorded), drift, uint64(i))
		state.Apply(observe(plan, variant), refine.Options{})
		m, data, err := state.Manifest(ls.recorded.Layout)
		if err != nil {
			t.Fatal(err)
		}
		enc, err := state.Encode()
		if err != nil {
			t.Fatal(err)
		}
		d, err := publisher.AttachRefinement(bg(), ls.lease, repository.Refinement{BaseSHA256: state.BaseSHA256,
			PreviousSHA256: ls.previous, Restores: state.Restores, Pages: int64(len(state.Pages)), Manifest: data, State: enc})
		if err != nil {
			t.Fatal(err)
		}
		ls.previous, plan, refinementBytes = d.SHA256, refinedPages(m), refinementBytes+d.Size
		rec, err := publisher.Get(bg(), ls.id)
		if err != nil {
			t.Fatal(err)
		}
		if p := rec.RefinedPack; p != nil && (len(packs) == 0 || *packs[len(packs)-1] != *p) {
			packs = append(packs, p)
			uploaded += p.StoredBytes + p.IndexSize
			t.Logf("restore %d: new refined pack, %.2f MiB, %d pages in the refined set", i, float64(p.StoredBytes)/(1<<20), len(plan))
		}
		if i%12 == 0 {
			ls.refined = m
			got := coldPrefetch(t, coldNode(t, publisher), ls.id, m.Ranges, ls.memory)
			streamed := packs[len(packs)-1].StoredBytes
			t.Logf("restore %d: cold node fetched %.2f MiB in %d GETs before ready; pack %.2f MiB, refined set %.2f MiB stored",
				i, float64(got.GetBytes)/(1<<20), got.Gets, float64(streamed)/(1<<20), float64(storedBytesOf(m, ls.memory))/(1<<20))
			if int64(got.GetBytes) > streamed+streamed/20 {
				t.Fatalf("restore %d: a cold node fetched %d bytes before ready, its pack is %d", i, got.GetBytes, streamed)
			}
			demandRead(t, coldNode(t, publisher), ls.id, m.Ranges, ls.memory)
		}
	}
	if limit := 1 + restores/refinedPackMinRestores; len(packs) > limit {
		t.Fatalf("%d refined packs built over %d attaches, want at most %d", len(packs), restores, limit)
	}
	t.Logf("%d attaches: %d refined packs, %.2f MiB of packs (%.2f MiB per attach) and %.1f KiB of refinements (%.1f KiB per attach) uploaded",
		restores, len(packs), float64(uploaded)/(1<<20), float64(uploaded)/restores/(1<<20),
		float64(refinementBytes)/1024, float64(refinementBytes)/restores/1024)
}

// driftedPages is pages (in first-touch order) with a share drift/2 of
// them dropped and as many pages added elsewhere in memory, placed at the
// ranks of the pages they replace: one drifting start-up, the same for
// one seed.
func driftedPages(pages []int64, drift float64, seed uint64) []int64 {
	rng := rand.New(rand.NewPCG(seed, 99))
	in := make(map[int64]bool, len(pages))
	for _, p := range pages {
		in[p] = true
	}
	out := slices.Clone(pages)
	for n := int(float64(len(pages)) * drift / 2); n > 0; {
		i, p := rng.IntN(len(out)), int64(rng.IntN(refpackMemoryBytes/4096))*4096
		if !in[p] {
			in[p], out[i], n = true, p, n-1
		}
	}
	return out
}

// observe is the observation of a restore whose prefetch had the whole
// plan in the guest's reach at once and whose guest touched touched (both
// memory offsets): what the guest needed outside the plan was missed,
// plan pages it did not touch were unused.
func observe(planOffsets, touchedOffsets []int64) refine.Observation {
	plan, touched := pageIndexes(planOffsets), pageIndexes(touchedOffsets)
	inPlan := make(map[int64]bool, len(plan))
	for _, p := range plan {
		inPlan[p] = true
	}
	obs := refine.Observation{Plan: plan, Frontier: []refine.Step{{At: 0, Index: len(plan)}}}
	used := map[int64]bool{}
	for i, p := range touched {
		if inPlan[p] {
			used[p] = true
			obs.Used = append(obs.Used, p)
			continue
		}
		obs.Demands = append(obs.Demands, refine.Demand{Page: p, At: time.Duration(i) * time.Microsecond, PlanIndex: -1})
	}
	for _, p := range plan {
		if !used[p] {
			obs.Untouched = append(obs.Untouched, p)
		}
	}
	return obs
}

// pageIndexes are the refine page indexes of memory offsets.
func pageIndexes(offsets []int64) []int64 {
	out := make([]int64, len(offsets))
	for i, off := range offsets {
		out[i] = off / refine.PageBytes
	}
	return out
}
