package synth

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"warmstart/internal/trace"
)

func referenceModel(t *testing.T, seed uint64) *Model {
	t.Helper()
	m, err := NewModel(DefaultMemoryBytes, seed)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newDrift(t *testing.T, m *Model, fraction float64) *Drift {
	t.Helper()
	d, err := NewDrift(m, fraction)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestVariantDriftIsTheFraction: a variant's touched pages differ from the
// base's by the drift fraction (dropped as many as added), every page is
// touched once, inside the layout, and the order changes only locally.
func TestVariantDriftIsTheFraction(t *testing.T) {
	const tolerance = 0.005
	m := referenceModel(t, 1)
	base := m.Stats().TouchedPages
	for _, f := range []float64{0.01, 0.05, 0.2, 0.5, 1} {
		d := newDrift(t, m, f)
		for k := 1; k <= 3; k++ {
			v := d.Variant(k)
			diff := trace.Compare(m.Trace, v)
			if math.Abs(diff.Fraction-f) > tolerance || diff.Dropped != diff.Added {
				t.Errorf("drift %v variant %d: %+v, want a fraction of %v ± %v, as many pages added as dropped", f, k, diff, f, tolerance)
			}
			if s := trace.Summarize(v); s.Pages != len(v) || s.Pages != base {
				t.Errorf("drift %v variant %d: %d touches of %d pages, want %d pages each touched once", f, k, len(v), s.Pages, base)
			}
			if err := trace.Validate(v, m.Layout); err != nil {
				t.Errorf("drift %v variant %d: %v", f, k, err)
			}
			if f <= 0.2 && diff.RankCorrelation < 0.95 {
				t.Errorf("drift %v variant %d: rank correlation %.3f with the base, want a locally perturbed order (>= 0.95)", f, k, diff.RankCorrelation)
			}
			if diff.RankCorrelation >= 1 {
				t.Errorf("drift %v variant %d: the shared pages keep the base's exact order", f, k)
			}
		}
	}
}

func TestVariantAtZeroDriftIsTheBase(t *testing.T) {
	m := referenceModel(t, 2)
	if v := newDrift(t, m, 0).Variant(1); !reflect.DeepEqual(v, m.Trace) {
		t.Fatal("variant at drift 0 differs from the base trace")
	}
}

func TestVariantsDeterministicAndDistinct(t *testing.T) {
	m := referenceModel(t, 1)
	d := newDrift(t, m, 0.2)
	again := newDrift(t, referenceModel(t, 1), 0.2)
	if !reflect.DeepEqual(d.Variant(4), again.Variant(4)) {
		t.Fatal("variant 4 of seed 1 differs between two generations")
	}
	other := newDrift(t, referenceModel(t, 2), 0.2)
	seen := map[string]int{}
	for k := 1; k <= 6; k++ {
		key := pageSetKey(d.Variant(k))
		if j, ok := seen[key]; ok {
			t.Errorf("variants %d and %d touch the same pages", j, k)
		}
		seen[key] = k
	}
	if a, b := trace.Compare(d.Variant(1), other.Variant(1)), 0.5; a.Fraction < b {
		t.Errorf("seeds 1 and 2 give variants differing by only %.2f of pages", a.Fraction)
	}
}

// TestVariantsDrawFromFinitePaths: pages added by one variant recur in
// about half the others, as do pages dropped, so a manifest learning from
// restores can catch up; added pages lie in the model's regions, in runs.
func TestVariantsDrawFromFinitePaths(t *testing.T) {
	const variants = 24
	m := referenceModel(t, 3)
	d := newDrift(t, m, 0.2)
	inBase := map[int64]bool{}
	for _, e := range m.Trace {
		inBase[e.Offset] = true
	}
	added, dropped := map[int64]int{}, map[int64]int{}
	for k := 1; k <= variants; k++ {
		in := map[int64]bool{}
		for _, e := range d.Variant(k) {
			in[e.Offset] = true
			if !inBase[e.Offset] {
				added[e.Offset]++
			}
		}
		for off := range inBase {
			if !in[off] {
				dropped[off]++
			}
		}
	}
	checkRecurrence(t, "added", added, variants, d.target)
	checkRecurrence(t, "dropped", dropped, variants, d.target)
	runs, pages := 0, 0
	for off := range added {
		p := int(off / trace.PageBytes)
		if m.region[p] == freeRegion {
			t.Fatalf("page %d added from free memory at drift 0.2", p)
		}
		if _, prev := added[off-trace.PageBytes]; !prev {
			runs++
		}
		pages++
	}
	if mean := float64(pages) / float64(runs); mean < 2 {
		t.Errorf("added pages come in runs of %.1f on average, want runs like the model's (>= 2)", mean)
	}
}

// checkRecurrence checks that a page counted by one variant is counted by
// about half of them, and that few distinct pages are counted at all.
func checkRecurrence(t *testing.T, name string, counts map[int64]int, variants, target int) {
	t.Helper()
	total := 0
	for _, n := range counts {
		total += n
	}
	recur := float64(total) / float64(len(counts)*variants)
	if recur < 0.35 || recur > 0.65 {
		t.Errorf("a page %s by one variant is %s by %.2f of variants, want about 1/2", name, name, recur)
	}
	if limit := poolOverTarget*target + target/5; len(counts) > limit {
		t.Errorf("%d distinct pages %s over %d variants, want at most the pool's ~%d", len(counts), name, variants, limit)
	}
}

func TestCheckVariantsRefuses(t *testing.T) {
	for _, c := range []struct {
		count    int
		fraction float64
		want     string
	}{
		{-1, 0.1, "-1 variants"},
		{MaxVariants + 1, 0.1, "want 0 to"},
		{3, math.NaN(), "drift NaN"},
		{3, 1.5, "drift 1.5"},
		{3, -0.1, "drift -0.1"},
		{3, 0, "drift 0 would all be the base"},
		{0, 0.2, "without variants"},
	} {
		err := CheckVariants(c.count, c.fraction)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckVariants(%d, %v) = %v, want an error saying %q", c.count, c.fraction, err, c.want)
		}
	}
	if err := CheckVariants(0, 0); err != nil {
		t.Errorf("no variants: %v", err)
	}
}

func TestGenerateWritesVariants(t *testing.T) {
	const size = 16 << 20
	dir := t.TempDir()
	if _, err := Generate(context.Background(), Options{MemoryBytes: size, Seed: 5, Dir: dir, Variants: 3, Drift: 0.1}); err != nil {
		t.Fatal(err)
	}
	m := referenceModel16(t, size, 5)
	d := newDrift(t, m, 0.1)
	for k := 1; k <= 3; k++ {
		got, err := trace.ReadFile(VariantPath(dir, k))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, d.Variant(k)) {
			t.Errorf("%s differs from variant %d of the model", VariantPath(dir, k), k)
		}
	}
	if filepath.Base(VariantPath(dir, 1)) != "startup.variant-001.trace" {
		t.Errorf("variant 1 is named %s", VariantPath(dir, 1))
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 4+3 {
		t.Errorf("directory holds %d entries, want the 4 files and 3 variants (no temporary file)", len(left))
	}
	if _, err := Generate(context.Background(), Options{MemoryBytes: size, Dir: t.TempDir(), Variants: 2}); err == nil {
		t.Error("variants at drift 0 accepted")
	}
}

func referenceModel16(t *testing.T, size int64, seed uint64) *Model {
	t.Helper()
	m, err := NewModel(size, seed)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func pageSetKey(entries []trace.Entry) string {
	set := make([]bool, DefaultMemoryBytes/trace.PageBytes)
	for _, e := range entries {
		set[e.Offset/trace.PageBytes] = true
	}
	var b strings.Builder
	for _, in := range set {
		if in {
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
	}
	return b.String()
}

func BenchmarkVariant(b *testing.B) {
	m, err := NewModel(DefaultMemoryBytes, 1)
	if err != nil {
		b.Fatal(err)
	}
	d, err := NewDrift(m, 0.2)
	if err != nil {
		b.Fatal(err)
	}
	for k := 1; b.Loop(); k++ {
		d.Variant(k)
	}
}
