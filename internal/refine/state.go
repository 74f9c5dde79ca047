// Package refine is the learned startup manifest of one snapshot: it starts
// from the recorded manifest and, after every restore that prefetched,
// applies what that restore observed. Pages the guest needed outside the
// manifest enter at the rank where it needed them, pages restores keep not
// touching age out, and ranks move toward the order the guest asked for
// pages in. It is pure logic: the repository stores a State, the restore
// builds an Observation, and whoever learns (the daemon, the CLI, the
// benchmark) calls Apply and Manifest in between.
package refine

import (
	"fmt"
	"slices"

	"warmstart/internal/layout"
	"warmstart/internal/manifest"
)

// PageBytes is the unit the state learns in: the base page every device
// serves in multiples of. Huge-page regions are learned per 4 KiB page and
// rounded back to their page size by Manifest.
const PageBytes = 4096

// Page is what the state knows of one page of guest memory.
type Page struct {
	// Page is the logical page index (offset in the memory file / PageBytes).
	Page int64
	// Rank orders prefetch: lower first. After Apply the ranks are
	// 0..n-1 in order; in between, a fraction places a page between two.
	Rank float64
	// Seen counts the restores that needed the page.
	Seen uint32
	// Unused counts the consecutive restores that observed it untouched.
	Unused uint32
}

// State is the learned manifest of one snapshot.
type State struct {
	// BaseSHA256 is the digest of the recorded manifest the state grew
	// from; a new recording starts a new state.
	BaseSHA256 string
	// BasePages is the recorded manifest's page count; it sets the
	// default size bound (Options.MaxPages).
	BasePages int64
	// Restores counts the observations applied.
	Restores uint64
	// Pages are in rank order.
	Pages []Page
}

// Initial is the state of a freshly recorded manifest: its pages ranked
// 0..n-1 in first-touch order. digest is the manifest's SHA-256.
func Initial(m *manifest.Manifest, digest string) State {
	s := State{BaseSHA256: digest}
	seen := map[int64]bool{}
	for _, r := range m.Ranges {
		for p := r.Offset / PageBytes; p*PageBytes < r.End(); p++ {
			if seen[p] {
				continue
			}
			seen[p] = true
			s.Pages = append(s.Pages, Page{Page: p, Rank: float64(len(s.Pages))})
		}
	}
	s.BasePages = int64(len(s.Pages))
	return s
}

// Manifest is the state as a startup manifest for layout l: its pages in
// rank order, a page that directly follows the page ranked before it in
// the same region extending that range. The encoding is a valid v1
// manifest, so a restore validates it like a recorded one; its digest
// changes exactly when the pages or their order do.
func (s State) Manifest(l layout.Layout) (*manifest.Manifest, []byte, error) {
	pages := slices.Clone(s.Pages)
	slices.SortStableFunc(pages, byRank)
	offsets := make([]int64, len(pages))
	for i, p := range pages {
		offsets[i] = p.Page * PageBytes
	}
	m, err := manifest.Build(l, offsets)
	if err != nil {
		return nil, nil, fmt.Errorf("refined manifest: %w", err)
	}
	data, err := manifest.Encode(m)
	if err != nil {
		return nil, nil, fmt.Errorf("refined manifest: %w", err)
	}
	return m, data, nil
}

func byRank(a, b Page) int {
	switch {
	case a.Rank < b.Rank:
		return -1
	case a.Rank > b.Rank:
		return 1
	}
	return 0
}
