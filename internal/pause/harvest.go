package pause

import (
	"fmt"
	"slices"

	"warmstart/internal/layers"
	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/memdev"
	"warmstart/internal/repository"
	"warmstart/internal/restore"
	"warmstart/internal/startupset"
)

// DefaultExtraPercent is how much of the startup path's bytes the written
// pages may add to a harvested manifest.
const DefaultExtraPercent = 25

// HarvestInput is what a pause knows of the pages its child's resume will
// need.
type HarvestInput struct {
	Layout layout.Layout
	// Startup are the pages the restore needed on its way to ready, in the
	// order it needed them; Written the pages the child's layer defines
	// (changed from the parent), ascending.
	Startup, Written []int64
	// ExtraPercent caps the written pages at this share of the startup
	// pages (all of them when there is no startup path).
	ExtraPercent int
}

// Harvest ranks the pages a resume of the child is likely to need into a
// startup manifest, each page once at its first tier: the startup path
// (what the guest needed to become ready: a resumed guest first re-runs
// its agent's paths), then the written pages (its state, touched by the
// work after ready), cut at ExtraPercent of the startup path.
func Harvest(in HarvestInput) (*manifest.Manifest, repository.Harvest, error) {
	seen := make(map[int64]bool, len(in.Startup)+len(in.Written))
	var order []int64
	var h repository.Harvest
	for _, p := range in.Startup {
		if !seen[p] {
			seen[p] = true
			order = append(order, p*layers.PageBytes)
			h.StartupPages++
		}
	}
	budget := int64(len(in.Written))
	if h.StartupPages > 0 {
		budget = h.StartupPages * int64(in.ExtraPercent) / 100
	}
	for _, p := range in.Written {
		if h.WrittenPages >= budget {
			break
		}
		if !seen[p] {
			seen[p] = true
			order = append(order, p*layers.PageBytes)
			h.WrittenPages++
		}
	}
	m, err := manifest.Build(in.Layout, order)
	if err != nil {
		return nil, h, fmt.Errorf("harvest: %w", err)
	}
	return m, h, nil
}

// startupPath is the pages the restore needed on its way to ready, in
// order: the prefetched plan pages it used, then what it faulted on
// demand; without prefetch, the demand reads of its timeline by arrival.
func startupPath(inst *restore.Instance) []int64 {
	var pages []int64
	if o := inst.Observation; o != nil {
		pages = append(pages, o.Used...)
		for _, d := range o.Demands {
			pages = append(pages, d.Page)
		}
		return pages
	}
	events := slices.Clone(inst.Events)
	slices.SortStableFunc(events, func(a, b startupset.Event) int { return int(a.Arrived() - b.Arrived()) })
	for _, e := range events {
		if e.Kind != memdev.Demand {
			continue
		}
		for p := e.Offset / layers.PageBytes; p*layers.PageBytes < e.Offset+int64(e.Length); p++ {
			pages = append(pages, p)
		}
	}
	return pages
}

// writtenPages are the pages a layer defines, ascending.
func writtenPages(m *layers.PageMap) []int64 {
	var pages []int64
	for _, runs := range [][]layers.Run{m.Data, m.Zero} {
		for _, r := range runs {
			for p := r.First; p < r.End(); p++ {
				pages = append(pages, p)
			}
		}
	}
	slices.Sort(pages)
	return pages
}

// harvestManifest is the child's startup manifest, encoded and verified
// against its layout, and how it was made; nil data when there is no page
// to name.
func harvestManifest(parent repository.Record, inst *restore.Instance, built *layers.Built, extra int) ([]byte, *repository.Recording, error) {
	in := HarvestInput{Layout: parent.Layout, Startup: startupPath(inst), ExtraPercent: extra}
	if built != nil {
		in.Written = writtenPages(built.Map)
	}
	m, h, err := Harvest(in)
	if err != nil {
		return nil, nil, err
	}
	if len(m.Ranges) == 0 {
		return nil, nil, nil
	}
	data, err := manifest.Encode(m)
	if err != nil {
		return nil, nil, fmt.Errorf("harvest: %w", err)
	}
	if _, err := manifest.Verify(data, manifest.Describe(data), parent.Layout); err != nil {
		return nil, nil, fmt.Errorf("harvest: %w", err)
	}
	h.FromRestore = inst.ID
	return data, &repository.Recording{Harvested: &h}, nil
}
