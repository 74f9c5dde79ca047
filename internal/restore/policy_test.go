package restore

import (
	"slices"
	"testing"

	"warmstart/internal/layout"
	"warmstart/internal/manifest"
	"warmstart/internal/prefetch"
	"warmstart/internal/repository"
)

func TestPolicies(t *testing.T) {
	m := &manifest.Manifest{
		Layout: layout.Single(1 << 20),
		Ranges: []manifest.Range{{Offset: 8192, Length: 4096}, {Offset: 0, Length: 4096}, {Offset: 4096, Length: 4096}},
	}
	inOrder := []prefetch.Range{{Offset: 8192, Length: 4096}, {Offset: 0, Length: 4096}, {Offset: 4096, Length: 4096}}
	sorted := []prefetch.Range{{Offset: 0, Length: 4096}, {Offset: 4096, Length: 4096}, {Offset: 8192, Length: 4096}}
	for _, tc := range []struct {
		name string
		want []prefetch.Range
		// the seed's figures where the policy is the seed's
		readers, buffer int
	}{
		{"seed", inOrder, 1, 1 << 20},
		{"warmstart", inOrder, 2, 1 << 20},
		{"e2b", inOrder, 8, 4096},
		{"reap", sorted, 1, 4 << 20},
	} {
		p, err := LookupPolicy(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Plan(m, false); !slices.Equal(got, tc.want) {
			t.Errorf("%s plan %v, want %v", tc.name, got, tc.want)
		}
		if o := p.TaskOptions(); o.Readers != tc.readers || o.BufferBytes != tc.buffer {
			t.Errorf("%s task options %+v", tc.name, o)
		}
	}
	if p, _ := LookupPolicy("reap"); !p.BeforeStart {
		t.Error("reap must finish before the guest runs")
	}
	// Only warmstart follows the guest: seed and e2b reproduce designs that
	// read in plan order, and a paused guest has nothing to follow.
	for name, follow := range map[string]bool{"seed": false, "e2b": false, "reap": false, "warmstart": true} {
		if p, _ := LookupPolicy(name); p.TaskOptions().Follow != follow {
			t.Errorf("%s task follows the guest: %v, want %v", name, p.TaskOptions().Follow, follow)
		}
	}
	if o := (Policy{Follow: true, BeforeStart: true}).TaskOptions(); o.Follow {
		t.Error("a task that ends before the guest runs was told to follow it")
	}
	if _, err := LookupPolicy("fastest"); err == nil {
		t.Error("an unknown policy was accepted")
	}
}

// The warmstart plan of a local lower file takes along the gaps of at
// most GapBytes between recorded ranges that neighbour in memory, keeps
// first-touch order, and takes nothing where the memory is remote.
func TestWarmstartPlanTakesSmallGaps(t *testing.T) {
	p, err := LookupPolicy("warmstart")
	if err != nil {
		t.Fatal(err)
	}
	gap := p.GapBytes
	if gap <= 0 {
		t.Fatalf("the warmstart policy takes no gaps (GapBytes %d)", gap)
	}
	const page = 4096
	m := &manifest.Manifest{Layout: layout.Single(1 << 20), Ranges: []manifest.Range{
		{Offset: 100 * page, Length: page},     // last in memory: nothing after it
		{Offset: 0, Length: page},              // gap of exactly GapBytes to the next
		{Offset: page + gap, Length: 2 * page}, // gap one page wider than GapBytes
		{Offset: 4*page + 2*gap, Length: page}, // gap to the last of one page
		{Offset: 4*page + 2*gap + 2*page, Length: page},
	}}
	// Ranges that touch in memory once the gaps are taken, and follow
	// each other closely in the plan, are read together.
	want := []prefetch.Range{
		{Offset: 100 * page, Length: page},
		{Offset: 0, Length: page + gap + 2*page},
		{Offset: 4*page + 2*gap, Length: 2*page + page},
	}
	if got := p.Plan(m, true); !slices.Equal(got, want) {
		t.Errorf("local plan\n got %v\nwant %v", got, want)
	}
	recorded := make([]prefetch.Range, len(m.Ranges))
	for i, r := range m.Ranges {
		recorded[i] = prefetch.Range{Offset: r.Offset, Length: r.Length}
	}
	if got := p.Plan(m, false); !slices.Equal(got, recorded) {
		t.Errorf("remote plan %v, want the recorded ranges %v", got, recorded)
	}
	// The peers' designs and the seed's read what was recorded.
	for _, name := range []string{"seed", "e2b"} {
		if q, _ := LookupPolicy(name); !slices.Equal(q.Plan(m, true), recorded) {
			t.Errorf("%s plan takes gaps: %v", name, q.Plan(m, true))
		}
	}
}

// A gap between two regions' ranges is taken only where both regions are
// one stretch of memory: across a hole between them it is no guest memory.
func TestPlanTakesNoGapAcrossAHole(t *testing.T) {
	p, err := LookupPolicy("warmstart")
	if err != nil {
		t.Fatal(err)
	}
	const page, mib = 4096, 1 << 20
	ranges := []manifest.Range{{Offset: mib - page, Length: page}, {Offset: mib + 2*page, Length: page}}
	for _, tc := range []struct {
		name    string
		regions []layout.Region
		want    int64 // the first range's planned length
	}{
		// The gap taken, the two ranges touch and are read at once.
		{"one region", []layout.Region{{Offset: 0, Size: 2 * mib, PageSize: page}}, 4 * page},
		{"adjacent regions", []layout.Region{{Offset: 0, Size: mib, PageSize: page}, {Offset: mib, Size: mib, PageSize: page}}, page},
		{"a hole between them", []layout.Region{{Offset: 0, Size: mib, PageSize: page}, {Offset: mib + 2*page, Size: mib, PageSize: page}}, page},
	} {
		l := layout.Layout{Regions: tc.regions, FileSize: 3 * mib}
		if err := l.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := p.Plan(&manifest.Manifest{Layout: l, Ranges: ranges}, true)
		if got[0].Length != tc.want || (tc.want == page && got[1] != (prefetch.Range{Offset: mib + 2*page, Length: page})) {
			t.Errorf("%s: plan %v, want the first range %d bytes long", tc.name, got, tc.want)
		}
	}
}

// A plan's ranges that continue each other in memory are read together
// when the later one comes at most mergeRanks after the earlier, up to a
// reader's buffer; further apart in the plan, or too large, they stay
// apart. No byte is read twice or left out.
func TestPlanReadsRangesThatContinueEachOtherTogether(t *testing.T) {
	const page = 4096
	rs := []prefetch.Range{
		{Offset: 10 * page, Length: page}, // continued by rank 2, then rank 3
		{Offset: 50 * page, Length: page},
		{Offset: 11 * page, Length: page},
		{Offset: 12 * page, Length: 2 * page},
		{Offset: 40 * page, Length: page}, // continued only far later
	}
	for i := 0; i < mergeRanks; i++ {
		rs = append(rs, prefetch.Range{Offset: int64(100+2*i) * page, Length: page})
	}
	rs = append(rs, prefetch.Range{Offset: 41 * page, Length: page})
	got := mergeNearRanks(slices.Clone(rs), mergeRanks, 1<<20)
	if got[0] != (prefetch.Range{Offset: 10 * page, Length: 4 * page}) || got[1] != rs[1] || got[2] != rs[4] {
		t.Fatalf("merged plan starts %v", got[:3])
	}
	if got[len(got)-1] != rs[len(rs)-1] || len(got) != len(rs)-2 {
		t.Fatalf("a range %d ranks later was merged: %d reads of %d", mergeRanks+1, len(got), len(rs))
	}
	var want, have int64
	for _, r := range rs {
		want += r.Length
	}
	for _, r := range got {
		have += r.Length
	}
	if have != want {
		t.Fatalf("merged plan reads %d bytes, the ranges hold %d", have, want)
	}
	if small := mergeNearRanks(slices.Clone(rs), mergeRanks, 2*page); small[0].Length != 2*page {
		t.Fatalf("a 2-page buffer read %v", small[0])
	}
}

// The lab's StrongDigests checks against the SHA-256 table on a node that
// trusts no key, which otherwise checks a POSIX store's memory against
// the CRC-32C one; a snapshot without a SHA-256 table keeps its CRC-32C.
func TestStrongDigestsChoosesTheSHA256Table(t *testing.T) {
	src := Source{Digests: &repository.DigestsDescriptor{SHA256: "crc"}, DigestsPath: "/crc",
		SHA256Digests: &repository.DigestsDescriptor{SHA256: "sha"}, SHA256DigestsPath: "/sha"}
	r := &Restorer{}
	if f := r.tableFor(src, false); f.path != "/crc" {
		t.Errorf("default: table %s, want the CRC-32C one", f.path)
	}
	if f := r.tableFor(src, true); f.path != "/sha" || f.name != repository.SHA256DigestsFileName {
		t.Errorf("strong: table %s (%s), want the SHA-256 one", f.path, f.name)
	}
	src.SHA256Digests, src.SHA256DigestsPath = nil, ""
	if f := r.tableFor(src, true); f.path != "/crc" {
		t.Errorf("strong without a SHA-256 table: %s, want the CRC-32C one", f.path)
	}
}
